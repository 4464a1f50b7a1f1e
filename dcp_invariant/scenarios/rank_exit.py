"""rank_exit_no_promotion: a rank dies in the middle of a save; nothing may be promoted.

The group first saves a complete baseline (promoted), then starts a second save during which
one rank writes its shard and exits before DCP's commit marker exists. The candidate must be
refused at sealing, kept for inspection, and the pointer must not move.
"""

from __future__ import annotations

from typing import Any

from dcp_invariant.rules import DYING_RANK, RANK_EXIT_CODE
from dcp_invariant.scenarios.common import (
    BASELINE,
    CANDIDATE,
    STEPS_BEFORE_SAVE,
    ScenarioContext,
)


def run(ctx: ScenarioContext) -> dict[str, Any]:
    obs = ctx.begin(
        fixture=ctx.fixture,
        steps_before_save=STEPS_BEFORE_SAVE,
        dying_rank=DYING_RANK,
        planned_exit_code=RANK_EXIT_CODE,
        baseline=None,
        candidate=None,
        load_attempted=False,
    )
    with ctx.recording(obs):
        saves = [(BASELINE, STEPS_BEFORE_SAVE), (CANDIDATE, STEPS_BEFORE_SAVE + 1)]
        crash = {"rank": DYING_RANK, "exit_code": RANK_EXIT_CODE}
        source = ctx.train(obs, saves, reference_step=False, crash=crash)
        if not source.timed_out:
            obs["baseline"] = ctx.commit(BASELINE)
            obs["candidate"] = ctx.commit(CANDIDATE)
    obs["load_attempted"] = ctx.load_attempted()
    return obs
