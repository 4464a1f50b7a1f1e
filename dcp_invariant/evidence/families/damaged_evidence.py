"""The damaged family: a sealed candidate is damaged, and promotion refuses it."""

from __future__ import annotations

from dcp_invariant import plan
from dcp_invariant.evidence.checks import integer, one_of, optional, record, string
from dcp_invariant.evidence.families._groups import consensus, group_finished
from dcp_invariant.evidence.families._promotion import (
    baseline_and_candidate,
    exactly_dcp_files,
    refusals,
    refused_after_baseline,
)
from dcp_invariant.evidence.families._record_parts import Obs, always, common_fields
from dcp_invariant.evidence.families._training_source import (
    refused_candidate_fields,
    source_sightings,
)

SHAPE = record(
    **common_fields,
    fixture=string,
    steps_before_save=integer(0),
    damage=record(kind=one_of("remove", "flip"), path=string, offset=optional(integer(0))),
    **refused_candidate_fields,
)

shape_for = always(SHAPE)


def rule(scenario: plan.Scenario, obs: Obs) -> list[str]:
    reasons = group_finished(obs["source"], scenario.source_world_size, "source")
    assert scenario.damage is not None, scenario.name
    kind, suffix, reason = (
        scenario.damage.kind,
        scenario.damage.target_suffix,
        scenario.damage.refusal,
    )
    damage = obs["damage"]
    if damage["kind"] != kind:
        reasons.append(f"damage: expected a {kind}, recorded a {damage['kind']}")
    if not damage["path"].endswith(suffix):
        reasons.append(f"damage: hit {damage['path']!r}, the scenario damages a {suffix} file")
    if (damage["offset"] is None) != (kind == "remove"):
        reasons.append("damage: a flip needs the offset it flipped, a removal has none")
    source = obs["source"]
    # Each rank reports after each of its two saves; no reference step is taken.
    reasons += [
        f"source rank {r['rank']}: recorded {len(r['saves'])} saves"
        f"{' and a reference step' if r['next'] is not None else ''}; the scenario makes 2, no step"
        for r in source["ranks"]
        if len(r["saves"]) != 2 or r["next"] is not None
    ]
    reasons += consensus([r["saves"] for r in source["ranks"]], "source: saved states")
    reasons += refused_after_baseline(obs, "candidate")
    if obs["baseline"] is not None:
        reasons += exactly_dcp_files(obs["baseline"], scenario.source_world_size, "baseline")
    candidate = obs["candidate"]
    if candidate is None:
        return reasons
    if not candidate["sealed"]:
        reasons.append("candidate: was never sealed, so the damage tested nothing")
    else:
        # The receipt lists the files as sealed, before the damage.
        reasons += exactly_dcp_files(candidate, scenario.source_world_size, "candidate")
    if candidate["receipt"] is not None and candidate["receipt"] == (obs["baseline"] or {}).get(
        "receipt"
    ):
        reasons.append("candidate: has the same receipt as the baseline")
    sizes = {f["path"]: f["size"] for f in candidate["files"]}
    if damage["path"] not in sizes:
        reasons.append(f"damage: {damage['path']} was not in the sealed receipt")
    else:
        reasons += _damage_target(damage, kind, suffix, candidate["files"])
    wanted = {"path": damage["path"], "reason": reason}
    if wanted not in candidate["refused"]:
        reasons.append(f"candidate: promotion did not report {damage['path']}: {reason}")
    elif candidate["refused"] != [wanted]:
        # Only one file was damaged, so the receipt check has exactly one failure to report.
        reasons.append(
            f"candidate: promotion reported {refusals(candidate)}, not only {damage['path']}"
        )
    return reasons


def _damage_target(damage: Obs, kind: str, suffix: str, files: list[Obs]) -> list[str]:
    """The driver damages the last non-empty file of the sealed candidate whose name ends with
    the plan's suffix, and flips the byte at half its size (``damage`` in
    dcp_invariant/suite/scenarios/damaged.py)."""
    eligible = sorted(f["path"] for f in files if f["path"].endswith(suffix) and f["size"] > 0)
    reasons = []
    if eligible and damage["path"] != eligible[-1]:
        reasons.append(
            f"damage: hit {damage['path']}, the scenario damages the last {suffix} file, "
            f"{eligible[-1]}"
        )
    size = next(f["size"] for f in files if f["path"] == damage["path"])
    if kind == "flip" and damage["offset"] is not None and damage["offset"] != size // 2:
        reasons.append(
            f"damage: flipped the byte at {damage['offset']} of {damage['path']}, the scenario "
            f"flips the middle one, at {size // 2} of its {size} bytes"
        )
    return reasons


commits = baseline_and_candidate
sightings = source_sightings
