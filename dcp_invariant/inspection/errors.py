"""What ``inspect`` finds wrong with a checkpoint's ``.metadata`` (exit 1); its bad input is in
:mod:`dcp_invariant.errors`."""

from __future__ import annotations

from dcp_invariant.errors import Error
from dcp_invariant.inspection.problems import Cause


class MetadataProblem(Error):
    """``.metadata`` cannot be read as DCP metadata; ``cause`` starts the reason printed."""

    cause: Cause = "malformed metadata"

    def reasons(self) -> tuple[str, ...]:
        """What to report, one problem line each (after the cause)."""
        return (str(self),)


class RefusedPickle(MetadataProblem):
    """The pickle names a global, or uses an opcode, that DCP never writes into ``.metadata``.

    Nothing it names is imported and nothing is called: the refusal is the whole outcome.
    """

    cause: Cause = "refused pickle"


class MalformedMetadata(MetadataProblem):
    """The pickle is truncated or invalid, or its records do not have the shape DCP writes."""

    cause: Cause = "malformed metadata"


class MetadataTooLarge(MetadataProblem):
    """``.metadata`` is larger than the bound (refused before a byte of it is read), or its
    records expand to more than its work budget (:mod:`.budget`)."""

    cause: Cause = "too large"


class BadValues(MetadataProblem):
    """Lengths, offsets, sizes or shapes no torch tensor or DCP read can hold: each named."""

    cause: Cause = "bad value"

    def __init__(self, found: tuple[str, ...]) -> None:
        super().__init__("; ".join(found))
        self.found = found

    def reasons(self) -> tuple[str, ...]:
        return self.found
