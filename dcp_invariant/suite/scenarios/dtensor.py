"""dtensor_A_to_B: a Shard(0) DTensor saved at world size A and loaded at world size B."""

from __future__ import annotations

from typing import Any

from dcp_invariant import plan
from dcp_invariant.suite.scenarios.common import STORE_ROOT, ScenarioContext
from dcp_invariant.suite.scenarios.payloads import (
    DTENSOR_LOAD,
    DTENSOR_SAVE,
    DTensorLoad,
    DTensorSave,
)


def run(ctx: ScenarioContext) -> dict[str, Any]:
    sc = ctx.scenario
    obs = ctx.begin(
        global_shape=list(plan.DTENSOR.shape),
        placement=plan.DTENSOR.placement,
        dtype=plan.DTENSOR.dtype,
        commit=None,
        target=None,
    )
    with ctx.recording(obs):
        save: DTensorSave = {"checkpoint": ctx.candidate_id(plan.DTENSOR_LABEL)}
        source = ctx.group("source", DTENSOR_SAVE(save), sc.source_world_size)
        obs["source"] = source.record()
        if not source.ok:
            return obs
        obs["commit"] = ctx.commit(plan.DTENSOR_LABEL)
        if not obs["commit"]["promoted"]:
            return obs
        load: DTensorLoad = {"store": STORE_ROOT}
        target = ctx.group("target", DTENSOR_LOAD(load), sc.target_world_size)
        obs["target"] = ctx.target_record(target)
    return obs
