"""The typed parts of an observation record, as the driver builds them and the rules read them.

Each mirrors a shape in :mod:`.record_parts` key for key (a test holds them together): the
shape is what a record loaded from JSON is checked against, these are what mypy checks the
code that builds and reads it against. A whole observation stays a plain dict: its keys vary
by family, and each family's shape says which.
"""

from __future__ import annotations

from typing import Any, TypedDict

from dcp_invariant import plan


class FileSize(TypedDict):
    path: str
    size: int


class FailureRecord(TypedDict):
    """One reason a directory does not match its receipt."""

    path: str
    reason: plan.FailureReason


class CommitRecord(TypedDict):
    """One seal-then-promote attempt: what was sealed, whether promotion took it, and the
    pointer and generation count around it. Receipts and pointers are labels (``receipt-1``)."""

    label: str
    sealed: bool
    seal_error: str | None
    receipt: str | None
    files: list[FileSize]
    promoted: bool
    refused: list[FailureRecord]
    candidate_retained: bool
    pointer_before: str | None
    pointer_after: str | None
    generations_before: int
    generations_after: int


class CutRecord(TypedDict):
    """A checkpoint cut short (half_written): of its files in name order, those copied whole,
    the one cut to half its bytes, and those left out."""

    kept: list[str]
    truncated: str
    left_out: list[str]


class RaisedRecord(TypedDict):
    """What the user's code raised on a rank, which ended it: the method it came from and the
    exception's type (never its message, which may hold paths)."""

    rank: int
    method: plan.AppMethod
    exception: str


class _GroupRequired(TypedDict):
    exit_codes: list[int]
    timed_out: bool
    ranks: list[dict[str, Any]]


# total=False, not NotRequired: under postponed annotations Python 3.11's TypedDict counts a
# NotRequired key among the required ones (typing.py reads the string), and a test compares
# __required_keys__ with the shape.
class GroupRecord(_GroupRequired, total=False):
    """A worker group: each rank's exit code, whether it outran its deadline, and each rank's
    report, whose keys depend on the task (each family's shape says which). ``raised``, present
    only when the user's code ended a rank, says what it raised; ``unfinished``, only when a
    rank's process exited 0 before its task returned (os._exit(0), say), names those ranks."""

    raised: list[RaisedRecord]
    unfinished: list[int]


class ObservationBase(TypedDict):
    """The fields every observation has, whatever its family."""

    errors: list[str]
    scenario: str
    schema_version: int
    source_world_size: int
    target_world_size: int
