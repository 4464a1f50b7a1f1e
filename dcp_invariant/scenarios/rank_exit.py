"""rank_exit_no_promotion: a rank dies in the middle of a save; nothing may be promoted.

The group first saves a complete baseline (promoted), then starts a second save during which
one rank writes its shard and exits before DCP's commit marker exists. The candidate must be
refused at sealing, kept for inspection, and the pointer must not move.
"""

from __future__ import annotations

from typing import Any

from dcp_invariant.rules import DYING_RANK
from dcp_invariant.scenarios.common import STEPS_BEFORE_SAVE, ScenarioContext, training_saves

BASELINE = f"step-{STEPS_BEFORE_SAVE}"
CANDIDATE = f"step-{STEPS_BEFORE_SAVE + 1}"
PLANNED_EXIT_CODE = 86


def run(ctx: ScenarioContext) -> dict[str, Any]:
    sc = ctx.scenario
    obs = ctx.base_observation()
    obs.update(
        fixture=ctx.fixture,
        steps_before_save=STEPS_BEFORE_SAVE,
        dying_rank=DYING_RANK,
        planned_exit_code=PLANNED_EXIT_CODE,
        baseline=None,
        candidate=None,
        load_attempted=False,
    )
    saves = training_saves(ctx, (BASELINE, STEPS_BEFORE_SAVE), (CANDIDATE, STEPS_BEFORE_SAVE + 1))
    saves[1]["crash"] = {"rank": DYING_RANK, "exit_code": PLANNED_EXIT_CODE}
    source = ctx.group(
        "source",
        "train_and_save",
        sc.source_world_size,
        {"fixture": ctx.fixture, "saves": saves, "reference_step": False},
    )
    obs["source"] = source.record()
    if source.timed_out:
        return obs
    obs["baseline"] = ctx.commit(BASELINE)
    # No load follows a refused candidate: the driver stops here by construction.
    obs["candidate"] = ctx.commit(CANDIDATE)
    return obs
