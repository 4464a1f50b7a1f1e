"""What a crash state holds, as far as a job's discovery can tell: each name under the run
directory (a randomly named temporary file by its shape, :func:`.operations.shape`), its kind,
its size and a symlink's target. Two snapshots of one crash point, taken
by two launches, are one state of the job when these agree.

With several processes (torchrun's ranks, a writer thread), where the others were when one
stopped at an operation is a matter of timing: rank 1 may have written more of its shard the
second time. Such a point is no single state of the job, so it is recorded and not judged.
"""

from __future__ import annotations

import os
from pathlib import Path

from dcp_invariant.evidence.preempt.operations import shape

Entry = tuple[str, str, int, str]  # relative path, kind, size, symlink target


def manifest(root: Path) -> list[Entry]:
    """Every entry under ``root``, sorted; symlinks are not followed."""
    entries: list[Entry] = []
    seen: dict[str, int] = {}
    for directory, dirs, files in os.walk(root):
        for name in sorted(dirs + files):
            path = Path(directory, name)
            relative = shape(path.relative_to(root).as_posix())
            seen[relative] = seen.get(relative, 0) + 1
            if seen[relative] > 1:  # two temporary files of one shape: both are kept
                relative += f"#{seen[relative]}"
            if path.is_symlink():
                entries.append((relative, "symlink", 0, os.readlink(path)))
            elif path.is_dir():
                entries.append((relative, "directory", 0, ""))
            else:
                entries.append((relative, "file", path.lstat().st_size, ""))
    return sorted(entries)


def first_difference(first: Path, second: Path) -> str | None:
    """How the two snapshots differ, in words (None: alike)."""
    one, two = dict(_keyed(manifest(first))), dict(_keyed(manifest(second)))
    for name in sorted(one.keys() | two.keys()):
        if one.get(name) != two.get(name):
            return (
                f"{name}: {_said(one.get(name))} the first time, {_said(two.get(name))} the second"
            )
    return None


def _keyed(entries: list[Entry]) -> list[tuple[str, tuple[str, int, str]]]:
    return [(path, (kind, size, target)) for path, kind, size, target in entries]


def _said(entry: tuple[str, int, str] | None) -> str:
    if entry is None:
        return "absent"
    kind, size, target = entry
    return {"file": f"{size} bytes", "directory": "a directory"}.get(kind, f"-> {target}")
