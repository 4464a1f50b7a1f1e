"""A worker group's checks: it finished in time, every rank exited cleanly and reported."""

from __future__ import annotations

from typing import Any

from dcp_invariant.evidence import diagnosis
from dcp_invariant.evidence.diagnosis import TIMEOUT
from dcp_invariant.evidence.families._record_parts import Obs
from dcp_invariant.evidence.families.records import GroupRecord, RaisedRecord


def group_finished(group: GroupRecord, world_size: int, where: str) -> list[str]:
    """The group finished in time, each of its ``world_size`` ranks exited 0 and reported."""
    reasons = []
    if group["timed_out"]:
        reasons.append(timed_out(where))
    codes = group["exit_codes"]
    if len(codes) != world_size:
        reasons.append(f"{where}: {len(codes)} exit codes for {world_size} ranks")
    if group["timed_out"]:
        return reasons  # its ranks were killed: how each exited says nothing more
    exits = rank_exits(group, where)
    if ended_early(group):
        return reasons + exits  # each rank that ended early is named already
    return reasons + exits + rank_set(group["ranks"], world_size, where)


def rank_exits(group: GroupRecord, where: str) -> list[str]:
    """Each rank that did not exit 0, by cause: what the user's code raised, or that it left
    without reporting (code 0 or not), or failed after it had reported."""
    stopped = _stopped(group)
    silent = _silent(group, stopped)
    raised = {r["rank"]: r for r in group.get("raised", [])}
    reasons = []
    for rank, code in enumerate(group["exit_codes"]):
        if rank in raised:
            reasons.append(_raised(raised[rank], where))
        elif rank in silent:
            reasons.append(
                f"{diagnosis.NO_REPORT}: {where} rank {rank}: exited with code {code} before its "
                "task finished; its log says why (a loop that calls os._exit, or sys.exit "
                "outside the calls the tool makes, ends so)"
            )
        elif code != 0 and not (code == 1 and rank in stopped):
            reasons.append(
                f"{diagnosis.RANK_FAILED}: {where} rank {rank}: exited with code {code}; its log "
                "says why"
            )
    return reasons


def ended_early(group: GroupRecord) -> bool:
    """The user's code ended a rank of the group, or a rank left without reporting: what the
    group's ranks then lack (steps, a load) is a consequence, not a reason of its own."""
    return bool(group.get("raised") or _silent(group, _stopped(group)))


def _silent(group: GroupRecord, stopped: set[int]) -> set[int]:
    """The ranks that left without reporting, or reported but exited 0 before their task
    finished (``unfinished``), other than those stopped at a non-finite loss."""
    reported = {r["rank"] for r in group["ranks"] if isinstance(r, dict)}
    unfinished = set(group.get("unfinished", [])) - stopped
    return {
        rank
        for rank in range(len(group["exit_codes"]))
        if rank not in reported or rank in unfinished
    }


def _stopped(group: GroupRecord) -> set[int]:
    """Fixture ranks that recorded a non-finite loss, and so stopped there with exit code 1:
    the loss, not the code, is the reason (reported by the family's rule)."""
    return {
        r["rank"] for r in group["ranks"] if isinstance(r, dict) and stopped_at_non_finite_loss(r)
    }


def _raised(record: RaisedRecord, where: str) -> str:
    return (
        f"{diagnosis.APP_RAISED[record['method']]}: {where} rank {record['rank']}: "
        f"{record['exception']}; its traceback is in the worker's log"
    )


def timed_out(phase: str) -> str:
    """A group that outran ``--timeout``: the phase, and what to do if the loop is that slow."""
    return (
        f"{TIMEOUT}: {phase}: timed out and was killed; if the loop is that slow, raise "
        "--timeout SECONDS (the limit of each worker group)"
    )


def rank_set(ranks: list[Obs], world_size: int, where: str) -> list[str]:
    """Reports from ranks 0 to ``world_size`` - 1, in order, once each."""
    got = [r["rank"] for r in ranks]
    if got != list(range(world_size)):
        return [
            f"{diagnosis.NO_REPORT}: {where}: reports from ranks {got}, expected "
            f"{list(range(world_size))}"
        ]
    return []


def consensus(values: list[Any], what: str) -> list[str]:
    """Every rank recorded the same value."""
    if any(v != values[0] for v in values[1:]):
        return [f"{what}: ranks disagree"]
    return []


def first_non_finite_loss(rank: Obs, steps_before: int) -> tuple[int, str] | None:
    """The first step whose recorded loss is NaN or infinite, and that loss, if any.

    A rank records such a loss and stops (dcp_invariant/ranks/fixture_tasks.py): the
    steps before the save are numbered from 1, those after it from N+1.
    """
    losses = list(enumerate(rank.get("losses_before", []), start=1))
    losses += [(steps_before + i, s["loss"]) for i, s in enumerate(rank["steps"], start=1)]
    for step, loss in losses:
        if loss in NON_FINITE:
            return step, loss
    return None


# float.hex() of the values that are not finite; the shape check admits no other spelling.
NON_FINITE = ("nan", "inf", "-inf")


def stopped_at_non_finite_loss(rank: Obs) -> bool:
    """A fixture rank that recorded a NaN or infinite loss, and so stopped there."""
    if not isinstance(rank.get("steps"), list):
        return False  # a registered scenario's record: it has no per-step losses
    return first_non_finite_loss(rank, 0) is not None
