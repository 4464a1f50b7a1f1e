"""dtensor_A_to_B: a Shard(0) DTensor saved at world size A and loaded at world size B."""

from __future__ import annotations

from typing import Any

from dcp_invariant.scenarios.common import STORE_ROOT, ScenarioContext

LABEL = "dtensor"
# Mirrors scenarios.tasks (which imports torch; the driver must not).
GLOBAL_SHAPE = [7, 3]
PLACEMENT = "Shard(0)"
DTYPE = "torch.float64"


def run(ctx: ScenarioContext) -> dict[str, Any]:
    sc = ctx.scenario
    obs = ctx.base_observation()
    obs.update(
        global_shape=GLOBAL_SHAPE, placement=PLACEMENT, dtype=DTYPE, commit=None, target=None
    )
    source = ctx.group(
        "source", "dtensor_save", sc.source_world_size, {"checkpoint": ctx.candidate_id(LABEL)}
    )
    obs["source"] = source.record()
    if not source.ok:
        return obs
    obs["commit"] = ctx.commit(LABEL)
    if not obs["commit"]["promoted"]:
        return obs
    target = ctx.group("target", "dtensor_load", sc.target_world_size, {"store": STORE_ROOT})
    obs["target"] = ctx.target_record(target)
    return obs
