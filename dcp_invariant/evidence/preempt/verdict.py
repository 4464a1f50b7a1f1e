"""The verdict at each crash point: the job relaunched on the state a kill left, judged against
its uninterrupted run. Pure, and torch-free: what the relaunch printed and left is recorded,
and these rules read only the record (``verify`` derives them again).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import TypedDict

from dcp_invariant.evidence.diagnosis import CANNOT_RESUME, LOST_CHECKPOINT, OTHER_RESULT
from dcp_invariant.evidence.preempt import step_lines
from dcp_invariant.evidence.preempt.operations import (
    HOWS,
    Operation,
    Point,
    described,
    first_of_each_save,
    intact_saves,
    point,
)


class Relaunch(TypedDict):
    """What the relaunch on one crash state did: its exit code (None: killed at its timeout),
    its step lines, and where its final state differs from the uninterrupted run's (None:
    equal, or not asked for)."""

    exit_code: int | None
    steps: dict[int, list[str]]
    final: str | None


def resume_step(relaunch: Relaunch, reference: Mapping[int, list[str]]) -> int:
    """The step the relaunch resumed after: one before the first step it printed (0: it
    started over). One that printed none had no step left: it resumed after the last."""
    return min(relaunch["steps"]) - 1 if relaunch["steps"] else max(reference, default=0)


def judged(
    operations: Sequence[Operation],
    relaunches: Mapping[Point, Relaunch],
    reference: Mapping[int, list[str]],
    timeout: float,
    grace: float,
    final_compared: bool = False,
) -> dict[Point, list[str]]:
    """Each crash point's reasons (none: it passes), in the order the points occur. With
    ``final_compared`` (``--final`` given), a step printed after the uninterrupted run's last is
    no difference where the final state is the same: it changed nothing the job keeps."""
    trusted = _trusted_saves(operations, relaunches, reference)
    verdicts = {}
    for operation in operations:
        for how in HOWS:
            relaunch = relaunches.get(point(how, operation))
            if relaunch is None:
                continue
            verdicts[point(how, operation)] = _reasons(
                described(how, operation, grace),
                relaunch,
                reference,
                _expected(operations, operation, trusted),
                timeout,
                final_compared,
            )
    return verdicts


def _trusted_saves(
    operations: Sequence[Operation],
    relaunches: Mapping[Point, Relaunch],
    reference: Mapping[int, list[str]],
) -> set[int]:
    """The saves the job's own discovery takes: relaunched on the state right after a save
    (the first operation of the next one), it resumed from that save or later. A file the job
    writes every step (a log) is a "save" this way too, but no relaunch resumes from it, so it
    is never expected of a relaunch."""
    trusted = set()
    firsts = first_of_each_save(operations)
    for before, after in itertools.pairwise(firsts):
        relaunch = relaunches.get(point("kill", after))
        if relaunch is None or relaunch["exit_code"] != 0:
            continue
        if resume_step(relaunch, reference) >= before.steps_before:
            trusted.add(before.steps_before)
    return trusted


def _expected(operations: Sequence[Operation], at: Operation, trusted: set[int]) -> int | None:
    """The newest save that was whole on disk at ``at``, that training had gone on after,
    and that the job is known to resume from."""
    whole = [s for s in intact_saves(operations, at) if s in trusted]
    return max(whole) if whole else None


def _reasons(
    where: str,
    relaunch: Relaunch,
    reference: Mapping[int, list[str]],
    expected: int | None,
    timeout: float,
    final_compared: bool,
) -> list[str]:
    code = relaunch["exit_code"]
    if code != 0:
        how = f"timed out after {timeout:g} s" if code is None else f"exited with code {code}"
        return [
            f"{CANNOT_RESUME}: {where}: the relaunch {how}, so the job would fail at every restart"
        ]
    reasons = []
    resumed = resume_step(relaunch, reference)
    if expected is not None and resumed < expected:
        started = "started over" if resumed == 0 else f"resumed after step {resumed}"
        reasons.append(
            f"{LOST_CHECKPOINT}: {where}: the relaunch {started}, though the save after step "
            f"{expected} was whole on disk and training had gone on after it"
        )
    if relaunch["steps"]:
        same_end = final_compared and relaunch["final"] is None
        differs = step_lines.first_difference(reference, relaunch["steps"], not same_end)
        if differs is not None:
            reasons.append(f"{OTHER_RESULT}: {where}: {differs}")
    if relaunch["final"] is not None:
        reasons.append(f"{OTHER_RESULT}: {where}: the final state differs: {relaunch['final']}")
    return reasons
