"""The reshard family of a fixture run: saved at one world size, loaded at another, every key
bit-identical."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dcp_invariant import plan
from dcp_invariant.evidence import diagnosis
from dcp_invariant.evidence.checks import list_of, record, string
from dcp_invariant.evidence.families._fixture_arms import (
    component,
    fixture_common_fields,
    fixture_sightings,
    fixture_train_rank,
    load_failures,
    saved_by_rank,
    source_committed,
)
from dcp_invariant.evidence.families._groups import (
    ended_early,
    first_non_finite_loss,
    group_finished,
)
from dcp_invariant.evidence.families._promotion import (
    commit_at_baseline,
    loaded_through_pointer,
)
from dcp_invariant.evidence.families._record_parts import Obs, always, group

SHAPE = record(
    **fixture_common_fields, source=group(fixture_train_rank), left_out=list_of(string, 64)
)

shape_for = always(SHAPE)


def rule(scenario: plan.Scenario, obs: Obs) -> list[str]:
    """Saved at a, loaded at b: every saved key loaded by some rank, each equal to what its
    source rank saved. Components declared rank-local (``left_out``, held to the plan by
    :func:`dcp_invariant.evidence.rules.derive`) are neither loaded nor compared: each target rank keeps its own."""
    n, a, b = obs["steps_before_save"], scenario.source_world_size, scenario.target_world_size
    reasons, judged = source_committed(scenario, obs)
    if not judged:
        return reasons
    commit, target = obs["commit"], obs["target"]
    if target is None:
        return [*reasons, "target: did not run"]
    reasons += group_finished(target, b, "resharded group")
    left_out = set(obs["left_out"])
    saved = {r: _without(keys, left_out) for r, keys in saved_by_rank(obs["source"]).items()}
    hints: list[str] = []
    for rank in target["ranks"]:
        where = f"rank {rank['rank']} at world size {b}"
        reasons += loaded_through_pointer(rank, commit, where)
        if rank["load_error"] is not None:
            continue
        if rank["loaded"] is None:
            reasons.append(f"{where}: did not load")
            continue
        # A rank beyond the source's takes the place of rank r mod a: replicated values agree.
        source_rank = rank["rank"] % a
        expected = saved.get(source_rank, {})
        loaded = _without(rank["loaded"], left_out)
        others = {r: s for r, s in saved.items() if r != source_rank}
        reasons += diagnosis.round_trip(
            f"{where} (saved by rank {source_rank} at {a})",
            expected,
            loaded,
            others,
            rank["diffs"],
            diagnosis.round_trip_cause(scenario),
        )
        if scenario.checkpointing == "dcp":  # the hints are about DCP's own ways
            hints += [
                h for h in diagnosis.round_trip_hints(expected, loaded, others) if h not in hints
            ]
        found = first_non_finite_loss(rank, n)
        if found is not None:
            reasons.append(diagnosis.non_finite_loss(where, *found))
        elif len(rank["steps"]) != obs["steps_after"] and not ended_early(target):
            reasons.append(
                f"{where}: took {len(rank['steps'])} steps, the plan has {obs['steps_after']}"
            )
    failed_loads = load_failures(scenario, target["ranks"], lambda r: f"rank {r} at world size {b}")
    if failed_loads:
        return reasons + failed_loads
    # A rank's data and loss may be its own, so ranks need not agree on the loss, unless the
    # loop showed before the save that it reports one loss for all of them.
    reasons += disagreement(obs["source"]["ranks"], target["ranks"], a)
    # What the whole group must do is load everything that was saved.
    loaded_anywhere: set[str] = set()
    for rank in target["ranks"]:
        loaded_anywhere.update(rank["loaded"] or {})
    if len(target["ranks"]) == b and all(r["loaded"] is not None for r in target["ranks"]):
        unloaded = sorted({k for keys in saved.values() for k in keys} - loaded_anywhere)
        if unloaded:
            components = sorted({component(k) for k in unloaded})
            reasons.append(
                f"{diagnosis.NOT_LOADED}: saved at world size {a}, loaded by no rank at {b}: "
                f"{diagnosis.named(unloaded)}; their values are dropped, as a loader keyed by "
                "rank loses its positions (torchtitan issue #811): make the state a DTensor, "
                "or, if each rank may start it afresh when the world size changes, declare it "
                + " ".join(f"--rank-local {c}" for c in components)
            )
    return reasons + hints


def disagreement(
    source: Sequence[Mapping[str, Any]], target: Sequence[Mapping[str, Any]], a: int
) -> list[str]:
    """Ranks that reported the same loss at every step before the save (at least two of them:
    the loop reports a global loss, all-reduced) must report the same loss at every step after
    the reshard; where they did not before, nothing is asked of them."""
    before = [tuple(r["losses_before"]) for r in source]
    if a < 2 or len(before) != a or not before[0] or len(set(before)) != 1:
        return []
    loaded = [r for r in target if r.get("load_error") is None and r.get("loaded") is not None]
    if len(loaded) < 2:
        return []
    for step in range(min(len(r["steps"]) for r in loaded)):
        losses = {r["rank"]: r["steps"][step]["loss"] for r in loaded}
        if len(set(losses.values())) > 1:
            shown = ", ".join(f"rank {r}: {diagnosis.number(v)}" for r, v in losses.items())
            return [
                f"{diagnosis.OUTSIDE_STATE_DICT}: the {a} ranks reported one loss at every "
                f"step before the save, yet after the reshard they differ at resumed step "
                f"{step + 1} ({shown}): a rank's state that steers its step is not in "
                "state_dict(), or does not reshard"
            ]
    return []


def _without(keys: Mapping[str, str], components: set[str]) -> dict[str, str]:
    if not components:
        return dict(keys)
    return {k: v for k, v in keys.items() if component(k) not in components}


commits = commit_at_baseline
sightings = fixture_sightings
