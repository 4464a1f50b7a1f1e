"""training_A_to_B: save at world size A, resume in fresh processes at world size B."""

from __future__ import annotations

from typing import Any

from dcp_invariant.suite.scenarios.common import STORE_ROOT, ScenarioContext
from dcp_invariant.suite.scenarios.payloads import LOAD_AND_STEP, LoadAndStep


def run(ctx: ScenarioContext) -> dict[str, Any]:
    sc = ctx.scenario
    obs = ctx.begin(
        fixture=ctx.fixture, steps_before_save=ctx.run_plan.steps_before, commit=None, target=None
    )
    with ctx.recording(obs):
        if not ctx.commit_baseline(obs):
            return obs
        payload: LoadAndStep = {
            "shape": ctx.run_plan.shape,
            "fixture": ctx.fixture,
            "fixture_args": ctx.run_plan.arguments,
            "store": STORE_ROOT,
        }
        target = ctx.group("target", LOAD_AND_STEP(payload), sc.target_world_size)
        obs["target"] = ctx.target_record(target)
    return obs
