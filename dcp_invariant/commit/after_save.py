"""What an app's own save had written when it returned, and what changed in it since.

An app's save has no marker its end could be read from (DCP's ``.metadata``): it is sealed as
it is once every rank's ``save()`` has returned. A thread of the app still writing then (an
upload, a metadata file written in the background) would be sealed with whatever it had written
by then, which differs from run to run. So each rank, right after its ``save()`` returned (or
its future completed), records the kind, size and modification time of every entry
(:func:`record`, one ``lstat`` each), beside the candidate; before the seal, the entries are
compared with those records (:func:`changed`). Several ranks record at different moments: an
entry is as the save left it if its state is the one some rank recorded. The copy of a shared
group's save keeps each file's times (:mod:`dcp_invariant.suite.scenarios.save_copy`).

Standard library only; the worker writes, the committing process reads.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from dcp_invariant import canonical, regular_file
from dcp_invariant.commit import tree
from dcp_invariant.commit.errors import SealError
from dcp_invariant.commit.receipt import MAX_DIRECTORIES
from dcp_invariant.dcp_layout import MAX_FILES

SUFFIX = ".saved-rank{rank}.json"
_RECORD = re.compile(r"\.saved-rank[0-9]{1,6}\.json")
_MAX_ENTRIES = MAX_FILES + MAX_DIRECTORIES
# A record of _MAX_ENTRIES paths of bounded length is far below this.
_MAX_RECORD_BYTES = 64 << 20
# What the commit's error says after the entry's name.
_FIX = (
    "save() must have finished writing when it returns: wait for the threads that write (or "
    "return their future, with saves_async = True)"
)


@dataclass(frozen=True)
class Changed:
    """What differs from every record: ``first``, the commit's error naming the first such
    entry; ``paths``, every one of them, relative."""

    first: str
    paths: frozenset[str]


def record(checkpoint: str | Path, rank: int) -> None:
    """Record what ``checkpoint`` holds now, as rank ``rank`` saw it, beside it."""
    directory = Path(checkpoint)
    entries = _entries(directory)
    data = canonical.dumps({"complete": entries is not None, "entries": entries or {}})
    path = directory.with_name(directory.name + SUFFIX.format(rank=rank))
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def changed(candidate: Path) -> Changed | None:
    """What in ``candidate`` differs from what every rank recorded when its save returned;
    None if nothing does, or no rank recorded (a DCP save) or some record is incomplete (too
    many entries, which the seal refuses)."""
    records = _records(candidate)
    now = _entries(candidate)
    if not records or now is None or any(r is None for r in records):
        return None
    saved = [r for r in records if r is not None]
    found: dict[str, str] = {}
    for path, state in now.items():
        seen = [r[path] for r in saved if path in r]
        if not seen:
            found[path] = "not there when save() returned"
        elif state not in seen:
            found[path] = "changed after save() returned"
    for path in set().union(*saved) - set(now):
        if all(path in r for r in saved):
            found[path] = "removed after save() returned"
    if not found:
        return None
    first = min(found)
    return Changed(f"{canonical.printable(first)}: {found[first]}; {_FIX}", frozenset(found))


def _state(st: os.stat_result) -> str:
    if stat.S_ISREG(st.st_mode):
        return f"file {st.st_size} {st.st_mtime_ns}"
    return regular_file.kind(st.st_mode)  # a directory's times change as the copy fills it


def _entries(directory: Path) -> dict[str, str] | None:
    """Every entry under ``directory`` by relative path, with its state; None past
    ``_MAX_ENTRIES`` entries (:func:`.tree.walk` bounds the depth and follows no symlink)."""
    out: dict[str, str] = {}
    for rel, st in tree.walk(directory):
        out[rel] = _state(st)
        if len(out) > _MAX_ENTRIES:
            return None
    return out


def _records(candidate: Path) -> list[dict[str, str] | None]:
    """The ranks' records beside ``candidate`` (None for an incomplete one)."""
    try:
        with os.scandir(candidate.parent) as it:
            names = sorted(
                e.name
                for e in it
                if e.name.startswith(candidate.name)
                and _RECORD.fullmatch(e.name.removeprefix(candidate.name))
            )
    except FileNotFoundError:
        return []
    out: list[dict[str, str] | None] = []
    for name in names:
        raw = regular_file.read(candidate.parent / name, bound=_MAX_RECORD_BYTES)
        value = canonical.loads(raw, what=name)
        entries = value.get("entries") if isinstance(value, dict) else None
        if not isinstance(entries, dict) or not all(isinstance(v, str) for v in entries.values()):
            raise SealError(f"{name}: not a record of the save's files; something overwrote it")
        out.append(entries if value.get("complete") is True else None)
    return out
