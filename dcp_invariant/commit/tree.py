"""A walk of a save's directory tree as the commit protocol bounds it: entered no deeper than a
receipt's directories go (:data:`.receipt.MAX_DEPTH`), never through a symlink, and tolerant of
entries that vanish meanwhile (a writer that has not finished)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

from dcp_invariant.commit.receipt import MAX_DEPTH

VANISHED: tuple[type[OSError], ...] = (FileNotFoundError, NotADirectoryError)


def walk(
    directory: Path, skipped: tuple[type[OSError], ...] = VANISHED
) -> Iterator[tuple[str, os.stat_result]]:
    """Every entry under ``directory``: its path relative to it and its own status (a symlink's,
    not its target's), in no set order. A directory that raises one of ``skipped`` when listed
    is passed over: its parent's entry already says what it was."""
    pending = [("", directory)]
    while pending:
        prefix, here = pending.pop()
        try:
            with os.scandir(here) as it:
                entries = list(it)
        except skipped:
            continue
        for entry in entries:
            st = entry.stat(follow_symlinks=False)
            rel = prefix + entry.name
            yield rel, st
            if stat.S_ISDIR(st.st_mode) and rel.count("/") < MAX_DEPTH:
                pending.append((f"{rel}/", Path(entry.path)))
