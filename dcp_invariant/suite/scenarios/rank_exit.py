"""rank_exit_no_promotion: a rank dies in the middle of a save; nothing may be promoted.

The group first saves a complete baseline (promoted), then starts a second save during which
one rank writes its shard and exits before DCP's commit marker exists. The candidate must be
refused at sealing, kept for inspection, and the pointer must not move.
"""

from __future__ import annotations

from typing import Any

from dcp_invariant import plan
from dcp_invariant.suite.scenarios.common import ScenarioContext
from dcp_invariant.suite.scenarios.payloads import Crash


def run(ctx: ScenarioContext) -> dict[str, Any]:
    obs = ctx.begin(
        fixture=ctx.fixture,
        steps_before_save=ctx.run_plan.steps_before,
        dying_rank=plan.DYING_RANK,
        planned_exit_code=plan.RANK_EXIT_CODE,
        baseline=None,
        candidate=None,
        load_attempted=False,
    )
    with ctx.recording(obs):
        crash: Crash = {"rank": plan.DYING_RANK, "exit_code": plan.RANK_EXIT_CODE}
        source = ctx.train(
            obs, ctx.run_plan.baseline_then_candidate, reference_step=False, crash=crash
        )
        if not source.timed_out:
            obs["baseline"] = ctx.commit(ctx.run_plan.baseline_label)
            obs["candidate"] = ctx.commit(ctx.run_plan.candidate_label)
    obs["load_attempted"] = ctx.load_attempted()
    return obs
