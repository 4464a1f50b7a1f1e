"""Every error the commit protocol raises, under one base class a caller can catch.

``CommitError.failures`` lists, file by file, why a directory does not match its receipt; it is
empty for errors that are not about a directory's content (a malformed record, a missing seal).
"""

from __future__ import annotations

from dataclasses import dataclass

from dcp_invariant.errors import Error
from dcp_invariant.plan import FailureReason


@dataclass(frozen=True)
class Failure:
    """One reason a directory does not match its receipt."""

    path: str
    reason: FailureReason

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"

    def to_record(self) -> dict[str, str]:
        return {"path": self.path, "reason": self.reason}


class CommitError(Error):
    """Base of the protocol's errors; the message says what to do."""

    def __init__(self, message: str, failures: list[Failure] | None = None) -> None:
        self.failures: list[Failure] = list(failures or [])
        super().__init__(message)


class SealError(CommitError):
    """A directory that cannot be sealed (wrong kind of entry, unfinished save)."""


class ReceiptError(CommitError, ValueError):
    """A receipt record that is malformed."""


class PointerError(CommitError, ValueError):
    """A pointer file that exists but is not a valid pointer record."""


class ReceiptMismatch(CommitError):
    """The directory on disk is not what its receipt says; carries every failure."""

    def __init__(self, what: str, failures: list[Failure]) -> None:
        super().__init__(
            f"{what} does not match its receipt: " + "; ".join(map(str, failures)), failures
        )


class StoreError(CommitError):
    """A store operation that cannot proceed."""


class PromotionRefused(StoreError):
    """A candidate whose files no longer match its receipt; it stays where it is."""

    def __init__(self, label: str, failures: list[Failure]) -> None:
        super().__init__(
            f"refusing to promote {label}: "
            + "; ".join(map(str, failures))
            + "; the pointer was not moved",
            failures,
        )


class LineageError(StoreError):
    """A lineage record that is malformed or forged, or contradicts the pointer or a generation."""


class StaleParent(StoreError):
    """The pointer moved since the candidate was sealed: another promotion won the race.

    Like ``git push`` refusing a non-fast-forward: ``expected`` is the pointer digest the
    candidate was sealed on, ``actual`` the pointer digest now (``None``: no pointer).
    """

    def __init__(
        self, label: str, expected: str | None, actual: str | None, generation: str
    ) -> None:
        self.label = label
        self.expected = expected
        self.actual = actual
        self.generation = generation
        super().__init__(
            f"refusing to promote {label}: stale parent: it was sealed on pointer "
            f"{_short(expected)}, but the pointer is now {_short(actual)}; the pointer was not "
            f"moved and generation {generation[:12]} stays on disk, unselected; resume from the "
            "pointer and save again"
        )


def _short(digest: str | None) -> str:
    return "none (empty store)" if digest is None else digest[:12]
