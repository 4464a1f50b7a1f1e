"""The shape of every observation record, checked by the verifier.

The runner builds observations as plain dicts; each family's module in
:mod:`dcp_invariant.evidence.families` says which keys and types its record must have, and this
module holds a record to that shape and to the plan. A record of the wrong shape makes the
artifact invalid; a record of the right shape is then judged by
:mod:`dcp_invariant.evidence.rules`.
"""

from __future__ import annotations

from typing import Any

from dcp_invariant import plan
from dcp_invariant.evidence import schema
from dcp_invariant.evidence.checks import Check
from dcp_invariant.evidence.families import FAMILIES
from dcp_invariant.evidence.families._fixture_arms import (
    fixture_resume_rank as fixture_resume_rank,
)
from dcp_invariant.evidence.families._record_parts import (
    AGGREGATE as AGGREGATE,
)
from dcp_invariant.evidence.families._record_parts import (
    aggregate as aggregate,
)
from dcp_invariant.evidence.families.records import CommitRecord


def shape_of(family: plan.Family, run_plan: plan.Plan) -> Check:
    return FAMILIES[family].shape_for(run_plan)


def validate(name: str, observation: Any, *, run_plan: plan.Plan) -> list[str]:
    """Every way ``observation`` departs from the shape of scenario ``name``; empty when valid."""
    scenario = run_plan.scenario(name)
    problems = shape_of(scenario.family, run_plan)(observation, name)
    if problems:
        return problems
    planned: list[tuple[str, Any]] = [
        ("scenario", scenario.name),
        ("schema_version", schema.version_for(run_plan)),
        ("source_world_size", scenario.source_world_size),
        ("target_world_size", scenario.target_world_size),
    ]
    # The registered suite's damage and dtensor records carry no fixture or step counts.
    for key, value in (
        ("fixture", run_plan.fixture),
        ("steps_before_save", run_plan.steps_before),
        ("steps_after", run_plan.steps_after),
    ):
        if key in observation:
            planned.append((key, value))
    for where, _, checkpoint in _commits(scenario, observation, run_plan):
        planned.append((f"{where}.label", checkpoint))
    for key, expected in planned:
        got = _at(observation, key)
        if got != expected:
            problems.append(f"{name}.{key}: expected {expected!r}, got {got!r}")
    return problems + _label_order(name, scenario, observation, run_plan)


def _at(record: dict[str, Any], dotted: str) -> Any:
    for key in dotted.split("."):
        record = record[key]
    return record


def _commits(
    scenario: plan.Scenario, obs: dict[str, Any], run_plan: plan.Plan
) -> list[tuple[str, CommitRecord, str]]:
    """Each commit the scenario's driver made, in order, with the checkpoint label it used."""
    steps = FAMILIES[scenario.family].commits(run_plan)
    return [(key, obs[key], label) for key, label in steps if obs[key] is not None]


def _label_order(
    name: str, scenario: plan.Scenario, obs: dict[str, Any], run_plan: plan.Plan
) -> list[str]:
    """Receipt and pointer labels must be numbered in the order the driver first met each digest.

    The driver's interner (``Interner`` in dcp_invariant/suite/scenarios/commits.py) hands out
    ``<kind>-1``, ``<kind>-2``, ... per scenario as digests first appear: for each commit the
    pointer before, the receipt, the pointer after; then each loading rank's generation in rank
    order; then, for the restart, the receipt and the pointer it re-resolved.
    """
    met: list[tuple[str, str, Any]] = []
    for where, commit, _ in _commits(scenario, obs, run_plan):
        met += [
            (f"{where}.pointer_before", "pointer", commit["pointer_before"]),
            (f"{where}.receipt", "receipt", commit["receipt"]),
            (f"{where}.pointer_after", "pointer", commit["pointer_after"]),
        ]
    target = obs.get("target")
    if target is not None:
        met += [
            (f"target.ranks[{i}].generation", "receipt", rank["generation"])
            for i, rank in enumerate(target["ranks"])
        ]
    after = obs.get("after")
    if after is not None:
        met += [("after.receipt", "receipt", after["receipt"])]
        met += [("after.pointer", "pointer", after["pointer"])]
    seen: dict[str, set[str]] = {"pointer": set(), "receipt": set()}
    for where, kind, value in met:
        if value is None or value in seen[kind]:
            continue
        expected = f"{kind}-{len(seen[kind]) + 1}"
        if value != expected:
            return [
                f"{name}.{where}: {value} is a new {kind} here, so it must be {expected}: "
                "labels are numbered in the order the digests first appear"
            ]
        seen[kind].add(value)
    return []
