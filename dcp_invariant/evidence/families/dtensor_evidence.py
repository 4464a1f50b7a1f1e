"""The dtensor family: a ``Shard(0)`` DTensor saved at one world size and loaded at another."""

from __future__ import annotations

from dcp_invariant import dcp_layout, plan
from dcp_invariant.evidence.checks import integer, optional, record, string
from dcp_invariant.evidence.families._groups import consensus, group_finished
from dcp_invariant.evidence.families._promotion import (
    committed_then_loaded,
    loaded_through_pointer,
)
from dcp_invariant.evidence.families._record_parts import (
    Obs,
    always,
    commit,
    common_fields,
    group,
    hex64,
    load_fields,
    shape,
)
from dcp_invariant.evidence.families._sightings import Sightings

dtensor_source_rank = record(rank=integer(0), local_shape=shape, global_digest=hex64)
dtensor_target_rank = record(
    **load_fields, local_shape=optional(shape), global_digest=optional(hex64)
)

SHAPE = record(
    **common_fields,
    global_shape=shape,
    placement=string,
    dtype=string,
    source=group(dtensor_source_rank),
    commit=optional(commit),
    target=optional(group(dtensor_target_rank)),
)

shape_for = always(SHAPE)


def rule(scenario: plan.Scenario, obs: Obs) -> list[str]:
    rows, *rest = obs["global_shape"] or [0]
    reasons = []
    tested = (obs["global_shape"], obs["placement"], obs["dtype"])
    planned = (list(plan.DTENSOR.shape), plan.DTENSOR.placement, plan.DTENSOR.dtype)
    if tested != planned:
        reasons.append(f"plan: tested {tested}, the scenario is defined as {planned}")
    reasons += group_finished(obs["source"], scenario.source_world_size, "source")
    source_ranks = obs["source"]["ranks"]
    reasons += consensus([r["global_digest"] for r in source_ranks], "source: global tensor digest")
    for rank in source_ranks:
        reasons += _shard_shape(rank, rows, rest, scenario.source_world_size, "source")
    saved = source_ranks[0]["global_digest"] if source_ranks else None
    loaded, commit, target = committed_then_loaded(scenario, obs)
    reasons += loaded
    if commit is None or target is None:
        return reasons
    for rank in target["ranks"]:
        where = f"target rank {rank['rank']}"
        reasons += loaded_through_pointer(rank, commit, where)
        if rank["local_shape"] is None:
            reasons.append(f"{where}: reported no local shard")
        else:
            reasons += _shard_shape(rank, rows, rest, scenario.target_world_size, "target")
        if rank["global_digest"] != saved:
            reasons.append(f"{where}: reconstructed global tensor differs from the saved one")
    return reasons


def _shard_shape(rank: Obs, rows: int, rest: list[int], world_size: int, where: str) -> list[str]:
    expected = [dcp_layout.expected_shard_rows(rows, world_size, rank["rank"]), *rest]
    if rank["local_shape"] != expected:
        return [
            f"{where} rank {rank['rank']}: local shard shape {rank['local_shape']}, expected {expected}"
        ]
    return []


def commits(run_plan: plan.Plan) -> list[tuple[str, str]]:
    return [("commit", plan.DTENSOR_LABEL)]


def sightings(seen: Sightings, name: str, obs: Obs, run_plan: plan.Plan) -> None:
    for side in ("source", "target"):
        for rank in (obs[side] or {"ranks": []})["ranks"]:
            where = f"{side} rank {rank['rank']}'s global tensor digest"
            seen.add("the DTensor's global digest", name, where, rank["global_digest"])
