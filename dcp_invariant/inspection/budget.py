"""How much work ``inspect`` may do for one ``.metadata``: in proportion to its bytes.

A pickle can name one object many times through its memo for two bytes a reference, so what
its records expand to -- and so what reading and checking them costs -- follows the references,
not the bytes: one chunk of 100,000 dimensions named 30,000 times is 262 KB of pickle and three
billion dimensions. So every chunk, dimension, dict entry and list element the records expand
to is counted once per reference, before it is expanded (as are the corners and grid cells the
tiling check counts, and the ranks the estimate fills in), and a file whose count passes its
budget is refused as ``too large`` naming what passed it.
"""

from __future__ import annotations

from typing import Final

from dcp_invariant.inspection.errors import MetadataTooLarge

# Units of work (a chunk, a dimension, an entry...) allowed per byte of .metadata. Whatever DCP
# writes costs bytes for each unit: a dimension is an integer opcode of at least two bytes, a
# chunk, a storage entry or a key a record of dozens, and pickle.dump shares an object at most
# a few times (a Size named by its chunk and its storage key). Measured on real saves of torch
# 2.13.0 (tests/data/metadata/, a 1 GiB FSDP2 checkpoint, 10**4 FSDP2 chunks, 10**5 tensors of
# one process): 0.09 to 0.13 units a byte, checks included. A tensor of 64 dimensions, its
# offsets shared with its storage key, would cost about 0.5. So 2 passes any real checkpoint
# (tens of millions of chunk-dimensions take a file of hundreds of MB, allowed as many units),
# and a hostile file gets at most the work of a real one some 20 times its size.
UNITS_PER_BYTE: Final = 2
# And every file, however small, may expand to this many: a small .metadata is checked whatever
# its shape, in a fraction of a second.
MIN_UNITS: Final = 1 << 18


class Budget:
    """The work left for one ``.metadata``; :meth:`spend` before doing it."""

    def __init__(self, units: int | None = None) -> None:
        # -1 until the file's size is known (:meth:`for_bytes`): nothing is refused before.
        self.limit = -1 if units is None else units
        self.spent = 0
        self.basis = "here"  # what the limit is, for the refusal

    def for_bytes(self, size: int) -> None:
        """Set the limit from the size of the file, unless one was given."""
        if self.limit < 0:
            self.limit = MIN_UNITS + UNITS_PER_BYTE * size
            self.basis = (
                f"for a file of {size} bytes ({UNITS_PER_BYTE} a byte and {MIN_UNITS} more)"
            )

    def left(self) -> int | None:
        """Units still to spend; None before the limit is set."""
        return None if self.limit < 0 else max(0, self.limit - self.spent)

    def spend(self, units: int, what: str) -> None:
        """Count ``units`` of work on ``what``; :class:`MetadataTooLarge` past the limit."""
        self.spent += units
        if self.spent > self.limit >= 0:
            raise MetadataTooLarge(
                f"{what}: the records of .metadata expand to more than the {self.limit} "
                f"chunks, dimensions and entries inspect allows {self.basis}; a pickle that "
                "names one object many times through its memo expands to every reference"
            )
