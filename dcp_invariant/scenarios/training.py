"""training_A_to_B: save at world size A, resume in fresh processes at world size B."""

from __future__ import annotations

from typing import Any

from dcp_invariant.scenarios.common import (
    BASELINE,
    STEPS_BEFORE_SAVE,
    STORE_ROOT,
    ScenarioContext,
    training_saves,
)


def run(ctx: ScenarioContext) -> dict[str, Any]:
    sc = ctx.scenario
    obs = ctx.begin(
        fixture=ctx.fixture, steps_before_save=STEPS_BEFORE_SAVE, commit=None, target=None
    )
    with ctx.recording(obs):
        # The saving group goes on for one step: that is the uninterrupted reference.
        source = ctx.group(
            "source",
            "train_and_save",
            sc.source_world_size,
            {
                "fixture": ctx.fixture,
                "saves": training_saves(ctx, (BASELINE, STEPS_BEFORE_SAVE)),
                "reference_step": True,
            },
        )
        obs["source"] = source.record()
        if not source.ok:
            return obs
        obs["commit"] = ctx.commit(BASELINE)
        if not obs["commit"]["promoted"]:
            return obs
        target = ctx.group(
            "target",
            "load_and_step",
            sc.target_world_size,
            {"fixture": ctx.fixture, "store": STORE_ROOT},
        )
        obs["target"] = ctx.target_record(target)
    return obs
