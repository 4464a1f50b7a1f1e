"""The free fields: leaves of an artifact that nothing can check, each with the reason.

Every other leaf is held to something: the plan, a re-derivation, DCP's file layout, or the
same fact recorded independently elsewhere in the artifact. The mutation test
(tests/evidence/test_mutations.py) changes every leaf of every checked-in artifact and
requires ``verify`` to refuse each edit, unless the leaf is listed here; it also requires each
entry here to be really unchecked, so the list cannot go stale. docs/evidence.md repeats it,
and the same test holds the two equal.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase


@dataclass(frozen=True)
class FreeField:
    files: str  # artifact paths, as an fnmatch pattern
    path: str  # the leaf inside the record: keys joined by dots, list positions as [];
    # a trailing ".*" stands for any key below (a fixture's own state keys)
    reason: str

    def covers(self, file: str, path: str) -> bool:
        if not fnmatchcase(file, self.files):
            return False
        if self.path.endswith(".*"):
            return path.startswith(self.path[:-1])
        return path == self.path


FREE_FIELDS: tuple[FreeField, ...] = (
    FreeField(
        "provenance.json",
        "source_revision",
        "the revision the caller names, or unknown outside a git checkout; the artifact holds "
        "nothing derived from the source",
    ),
    FreeField(
        "provenance.json",
        "cpython",
        "any CPython 3.11+ runs the suite identically; only the form of the version is checked",
    ),
    FreeField(
        "provenance.json",
        "machine",
        "the architecture leaves no trace in the evidence (CPU wheels compute alike on x86_64 and "
        "arm64 for these fixtures); only its form is checked",
    ),
    FreeField(
        "provenance.json",
        "numpy",
        "torch's numpy leaves no trace in the evidence; only the form of the version is checked",
    ),
    FreeField(
        "observations/dtensor_*.json",
        "commit.files[].size",
        "the only DTensor save at its world size: no sibling records the same save, and DCP's "
        "byte layout is torch's to change",
    ),
    FreeField(
        "observations/reshard_*.json",
        "target.ranks[].steps[].keys.*",
        "the resharded steps are compared with nothing: summed in another order, a step at "
        "another world size may differ in its last bits (see Limits)",
    ),
    FreeField(
        "observations/reshard_*.json",
        "target.ranks[].steps[].loss",
        "as above, and a rank's loss may be its own (its own data): only its finiteness is checked",
    ),
    FreeField(
        "observations/*.json",
        "reference.ranks[].objects.*",
        "the app's own objects: at the end only their tensors and generators are judged, "
        "against the resumed run's; the rest only names a cause in a reason that fails on its "
        "own",
    ),
    FreeField(
        "observations/*.json",
        "repeat.ranks[].objects.*",
        "as above, for the other uninterrupted arm",
    ),
    FreeField(
        "observations/*.json",
        "never_saves.ranks[].objects.*",
        "they only name what the save changed, in a reason that fails on its own (the losses "
        "after the save differ)",
    ),
    FreeField(
        "observations/*.json",
        "target.ranks[].objects.*",
        "right after the load they only name a cause in a reason that fails on its own; at the "
        "end only the app's tensors and generators are judged, not its numbers, strings or the "
        "global RNGs",
    ),
    FreeField(
        "observations/reshard_*.json",
        "source.ranks[].objects.*",
        "a reshard compares no object: the source's world size is not the target's",
    ),
    FreeField(
        "observations/rank_exit_no_promotion.json",
        "candidate.seal_error",
        "the commit protocol's wording; what it says (not sealed, no .metadata among the "
        "files) is checked in those fields",
    ),
)


def free_field(file: str, path: str) -> FreeField | None:
    """The entry that frees leaf ``path`` of artifact file ``file``, if one does."""
    return next((free for free in FREE_FIELDS if free.covers(file, path)), None)
