"""A worker group's checks: it finished in time, every rank exited cleanly and reported."""

from __future__ import annotations

from typing import Any

from dcp_invariant.evidence.diagnosis import TIMEOUT
from dcp_invariant.evidence.families._record_parts import Obs
from dcp_invariant.evidence.families.records import GroupRecord


def group_finished(group: GroupRecord, world_size: int, where: str) -> list[str]:
    """The group finished in time, each of its ``world_size`` ranks exited 0 and reported."""
    reasons = []
    if group["timed_out"]:
        reasons.append(timed_out(where))
    codes = group["exit_codes"]
    if len(codes) != world_size:
        reasons.append(f"{where}: {len(codes)} exit codes for {world_size} ranks")
    # A fixture rank that recorded a non-finite loss stops there with exit code 1; the loss,
    # not the code, is the reason (reported by the family's rule).
    stopped = {
        r["rank"] for r in group["ranks"] if isinstance(r, dict) and stopped_at_non_finite_loss(r)
    }
    reasons += [
        f"{where} rank {r}: exited with code {c}"
        for r, c in enumerate(codes)
        if c != 0 and not (c == 1 and r in stopped)
    ]
    return reasons + rank_set(group["ranks"], world_size, where)


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
        return [f"{where}: reports from ranks {got}, expected {list(range(world_size))}"]
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
