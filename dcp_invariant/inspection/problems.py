"""A problem ``inspect`` found: its cause class first, then what and where, on one line."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dcp_invariant import canonical

Cause = Literal[
    # .metadata itself
    "refused pickle",
    "malformed metadata",
    "bad value",
    "too large",
    "unreadable",
    # the files the storage entries name
    "unsafe path",
    "missing file",
    "not a regular file",
    "truncated",
    # the items
    "missing item",
    "unknown storage",
    # how each tensor's chunks tile its shape
    "bad chunk",
    "out of bounds",
    "overlap",
    "gap",
    "unchecked",
    # a dcp-invariant generation against its receipt
    "receipt",
    "receipt mismatch",
]


@dataclass(frozen=True)
class Problem:
    cause: Cause
    detail: str

    def __str__(self) -> str:
        return canonical.shown(f"{self.cause}: {self.detail}")
