"""The registered fixture's training source, which the training, elastic, rank_exit and damaged
families share: its shape, its checks, a resumed rank against it, and what it adds to the
sightings across scenarios."""

from __future__ import annotations

from typing import Any

from dcp_invariant import dcp_layout, plan
from dcp_invariant.evidence import diagnosis
from dcp_invariant.evidence.checks import Check, boolean, integer, list_of, optional, record
from dcp_invariant.evidence.families._groups import group_finished
from dcp_invariant.evidence.families._promotion import loaded_through_pointer
from dcp_invariant.evidence.families._record_parts import (
    AGGREGATE,
    Obs,
    commit,
    digests,
    group,
    step,
)
from dcp_invariant.evidence.families._sightings import Sightings
from dcp_invariant.evidence.families.records import CommitRecord

training_source_rank = record(rank=integer(0), saves=list_of(digests, 4), next=optional(step))
# The rest of a rank_exit or damaged record: the source group, the committed baseline, the
# candidate the scenario acts on, and whether a load followed its refusal.
refused_candidate_fields: dict[str, Check] = {
    "source": group(training_source_rank),
    "baseline": optional(commit),
    "candidate": optional(commit),
    "load_attempted": boolean,
}


def saved_and_stepped(
    obs: Obs, world_size: int
) -> tuple[list[str], dict[int, Any], dict[int, Any]]:
    """Reasons about the saving group, plus each rank's saved state and uninterrupted next step.

    Nothing here requires the ranks to agree: a rank's state is its own unless a rule that
    reshards says otherwise (:func:`dcp_invariant.evidence.families.training_evidence.rule`).
    """
    source = obs["source"]
    reasons = group_finished(source, world_size, "source")
    ranks = source["ranks"]
    for rank in ranks:
        if len(rank["saves"]) != 1 or rank["next"] is None:
            reasons.append(f"source rank {rank['rank']}: did not save once and step as planned")
    complete = [r for r in ranks if len(r["saves"]) == 1 and r["next"] is not None]
    saved = {r["rank"]: r["saves"][-1] for r in complete}
    reference = {r["rank"]: r["next"] for r in complete}
    return reasons, saved, reference


def lost_at_load(
    rank: Obs, saved: Any, reference: Any, rank_0s: Any = None, *, user_fixture: bool
) -> bool:
    """Whether a resumed rank loaded other state than its source rank saved, which its next
    step did not make good. A rank whose next step matches the uninterrupted run's, every
    component included, lost nothing where it is a rank other than 0 that holds rank 0's saved
    copy (``rank_0s``), which the step overwrote
    (:func:`dcp_invariant.evidence.diagnosis.holds_rank_0s_copy`), and, in a user's fixture
    (``user_fixture``), wherever the load was applied at that step (:func:`restored_late`).
    The registered fixture's load is DCP's own, applied at once: a difference is a loss."""
    if saved is None or rank["loaded"] is None:
        return False
    if not _compare_digests(saved, rank["loaded"], ""):
        return False
    return not (
        _stepped_alike(rank, reference) and (user_fixture or _holds_rank_0s(rank, saved, rank_0s))
    )


def _holds_rank_0s(rank: Obs, saved: Any, rank_0s: Any) -> bool:
    return diagnosis.holds_rank_0s_copy(
        _components(saved),
        _components(rank["loaded"]),
        None if rank_0s is None else _components(rank_0s),
    )


def _stepped_alike(rank: Obs, reference: Any) -> bool:
    return (
        reference is not None
        and rank["next"] is not None
        and rank["next"]["loss"] == reference["loss"]
        and not _compare_digests(reference["digests"], rank["next"]["digests"], "")
    )


def restored_late(rank: Obs, saved: Any, reference: Any, where: str, rank_0s: Any) -> list[str]:
    """The caution for a rank that loaded other state than it saved and then stepped as the
    uninterrupted run did, as a resume's K steps are judged (resume_evidence.rule): the load
    was applied at the first step. Not for rank 0's copy held by another rank."""
    if saved is None or rank["loaded"] is None or not _stepped_alike(rank, reference):
        return []
    loaded, mine = _components(rank["loaded"]), _components(saved)
    if loaded == mine or _holds_rank_0s(rank, saved, rank_0s):
        return []
    return diagnosis.restored_late(
        where, diagnosis.named(diagnosis.differing_keys(mine, loaded)), "the load"
    )


def _components(digests: Any) -> dict[str, str]:
    return {c: d for c, d in digests.items() if c != AGGREGATE}


def resumed(
    rank: Obs,
    commit: CommitRecord,
    saved: Any,
    reference: Any,
    where: str,
    scenario: plan.Scenario,
    *,
    rank_0s: Any = None,
    others_lost: bool = False,
    user_fixture: bool = False,
) -> list[str]:
    """One resumed rank against the state its source rank saved and that rank's next step;
    ``rank_0s``: source rank 0's saved state, where each rank resumes its own;
    ``others_lost``: another rank of its group lost state (:func:`lost_at_load`, as
    ``user_fixture`` says)."""
    reasons = loaded_through_pointer(rank, commit, where)
    if rank["loaded"] is None or rank["next"] is None:
        return [*reasons, f"{where}: did not load and step"]
    lost = (
        _compare_digests(saved, rank["loaded"], f"{where}: after load")
        if lost_at_load(rank, saved, reference, rank_0s, user_fixture=user_fixture)
        else []
    )
    if user_fixture:
        reasons += restored_late(rank, saved, reference, where, rank_0s)
    round_trip = diagnosis.round_trip_cause(scenario)
    reasons += [f"{round_trip}: {r}" for r in lost]
    if reference is None:
        return reasons
    # Loaded == saved, yet the step differs: what steers it is not saved. Otherwise the step
    # follows from the load already reported, and says nothing more about the cause; a rank
    # whose own load was whole steps with the others (an all-reduce, DDP's broadcast of rank
    # 0's buffers), so another rank's lost state moves its step too.
    outside, advice = diagnosis.outside_cause(scenario)
    if lost:
        cause, tail = round_trip, ", a consequence of the load"
    elif others_lost:
        cause, tail = round_trip, ", a consequence of another rank's load (ranks step together)"
    else:
        cause, tail = outside, f"; {advice}"
    diverged = []
    if rank["next"]["loss"] != reference["loss"]:
        diverged.append(
            f"{where}: resumed step loss {rank['next']['loss']} differs from the uninterrupted "
            f"{reference['loss']}"
        )
    diverged += _compare_digests(
        reference["digests"], rank["next"]["digests"], f"{where}: after the resumed step"
    )
    return (
        reasons
        + [f"{cause}: {r}{tail}" for r in diverged[:1]]
        + [f"{cause}: {r}" for r in diverged[1:]]
    )


def _compare_digests(expected: dict[str, str], got: dict[str, str], where: str) -> list[str]:
    reasons = [f"{where}: component {c!r} is missing" for c in sorted(set(expected) - set(got))]
    reasons += [f"{where}: unexpected component {c!r}" for c in sorted(set(got) - set(expected))]
    for component in sorted(set(expected) & set(got)):
        if component != "aggregate" and expected[component] != got[component]:
            reasons.append(f"{where}: component {component!r} differs from the uninterrupted run")
    return reasons


def source_sightings(seen: Sightings, name: str, obs: Obs, run_plan: plan.Plan) -> None:
    n, w = run_plan.steps_before, obs["source_world_size"]
    for rank in obs["source"]["ranks"]:
        where = f"source rank {rank['rank']}"
        # Only the registered fixture is replicated and exact across world sizes; a user's
        # state may be per rank, so it is compared rank by rank at one world size.
        at = "" if run_plan.kind == "registered" else f" on rank {rank['rank']} of {w}"
        if rank["saves"]:
            seen.add(f"the state after {n} steps{at}", name, f"{where}'s save", rank["saves"][0])
        if len(rank["saves"]) > 1:  # the damage scenarios' candidate, one step later
            seen.add(
                f"the state after {n + 1} steps{at}",
                name,
                f"{where}'s second save",
                rank["saves"][1],
            )
        if rank["next"] is not None:
            step = rank["next"]
            seen.add(
                f"the state after {n + 1} steps{at}", name, f"{where}'s next step", step["digests"]
            )
            seen.add(f"the loss of step {n + 1}{at}", name, f"{where}'s next loss", step["loss"])
    for key in ("commit", "baseline"):
        if obs.get(key) is not None and obs[key]["sealed"]:
            files = obs[key]["files"]
            seen.add(
                f"the files of the save after {n} steps on {w} ranks", name, f"{key}.files", files
            )
    candidate = obs.get("candidate")
    if candidate is not None:
        if candidate["sealed"]:  # as sealed, before the damage
            what = f"the files of the save after {n + 1} steps on {w} ranks"
            seen.add(what, name, "candidate.files", candidate["files"])
        # What a save cut short leaves: the same shards, no .metadata.
        shards = [f for f in candidate["files"] if f["path"] != dcp_layout.METADATA_FILE]
        what = f"the shards of the save after {n + 1} steps on {w} ranks"
        seen.add(what, name, "candidate's shards", shards)
