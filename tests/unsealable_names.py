"""What :mod:`unsealable_loops` writes, by name and size: torch-free, so the tests that read
these collect where torch is not installed (the package-boundary job)."""

from __future__ import annotations

# What each save adds beside the rank's own file, by name (relative to the checkpoint).
SPECIAL = "special"
# The sparse file's size: far more than the copy could read within the 2 s an interrupt has.
SPARSE_BYTES = 2 << 30
SPARSE = "sparse.bin"
# The one data block the sparse file holds, at its middle: its holes are on both sides.
SPARSE_DATA = b"data in the middle of a hole"
LATE = "late.bin"
# How long the late writer waits after save() returned before it writes: well inside the K
# steps that follow the save, so the file is there when the group ends, in every run.
LATE_DELAY_SECONDS = 0.2
# Device numbers (Linux's): /dev/zero, which never ends, and /dev/null, which reads as empty.
ZERO = (1, 5)
NULL = (1, 3)
