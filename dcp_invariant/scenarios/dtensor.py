"""dtensor_A_to_B: a Shard(0) DTensor saved at world size A and loaded at world size B."""

from __future__ import annotations

from typing import Any

from dcp_invariant import schema
from dcp_invariant.scenarios.common import STORE_ROOT, ScenarioContext

LABEL = "dtensor"


def run(ctx: ScenarioContext) -> dict[str, Any]:
    sc = ctx.scenario
    obs = ctx.begin(
        global_shape=list(schema.DTENSOR_SHAPE),
        placement=schema.DTENSOR_PLACEMENT,
        dtype=schema.DTENSOR_DTYPE,
        commit=None,
        target=None,
    )
    with ctx.recording(obs):
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
