"""Whether every item the metadata names has its bytes where ``storage_data`` says they lie.

FileSystemReader opens ``checkpoint_dir / relative_path`` and reads ``length`` bytes at
``offset`` for each item (torch/distributed/checkpoint/filesystem.py ``read_data``; the items
carry no content hash), and DCP loads whatever it finds there. So each file named must be a
regular file inside the directory, and each range must lie inside its file. The directory is
listed once (one ``lstat`` per entry); no shard is opened.
"""

from __future__ import annotations

import itertools
import operator
import os
import stat
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dcp_invariant import canonical, regular_file
from dcp_invariant.inspection import records, tiling
from dcp_invariant.inspection.problems import Problem

# Items named per problem line; the rest are counted.
_EXAMPLES = 2
# A checkpoint may have millions of items: what is checked of every item is checked first by
# map() over its columns (each map runs at C speed), and item by item only to say what is wrong.
_OFFSETS = operator.attrgetter("offsets")


@dataclass(frozen=True)
class Entry:
    """One directory entry, as ``lstat`` saw it."""

    name: str
    kind: str  # regular_file.kind(): "regular file", "symlink", ...
    size: int


def listing(directory: Path) -> dict[str, Entry]:
    """Every entry of ``directory``: one scandir, one ``lstat`` per entry, none followed."""
    entries = {}
    with os.scandir(directory) as it:
        for entry in it:
            st = entry.stat(follow_symlinks=False)
            entries[entry.name] = Entry(entry.name, regular_file.kind(st.st_mode), st.st_size)
    return entries


def is_regular(entry: Entry) -> bool:
    return entry.kind == regular_file.kind(stat.S_IFREG)


def check_items(metadata: records.Metadata) -> list[Problem]:
    """Every key with an item DCP would read and no storage entry: a byte item, or a non-empty
    chunk of a tensor (an empty chunk is never read)."""
    storage = metadata.storage_data
    if storage is None:
        return [
            Problem(
                "unknown storage",
                f"storage_data is {metadata.storage_kind}, not FileSystemWriter's map of items "
                "to files; inspect checks checkpoints written by dcp.save to a directory",
            )
        ]
    # MetadataIndex compares fqn and offset (its index is a hint): so do these pairs.
    present = records.StorageData.of(storage).keys_present()
    problems = []
    for key, item in metadata.state_dict_metadata.items():
        if isinstance(item, records.BytesStorageMetadata):
            if (key, None) not in present:
                problems.append(
                    Problem("missing item", f"{key}: a byte item with no storage entry")
                )
            continue
        if all(map(present.__contains__, zip(itertools.repeat(key), map(_OFFSETS, item.chunks)))):
            continue  # every chunk has its entry (an empty one needs none)
        absent = [
            chunk.offsets
            for chunk in item.chunks
            if (key, chunk.offsets) not in present and all(chunk.sizes)
        ]
        if absent:
            shown = ", ".join(_offsets(o) for o in absent[:_EXAMPLES])
            more = f" and {len(absent) - _EXAMPLES} more" if len(absent) > _EXAMPLES else ""
            problems.append(
                Problem(
                    "missing item",
                    f"{key}: {_count(len(absent), 'chunk')} with no storage entry "
                    f"(at offsets {shown}{more})",
                )
            )
    return problems


def check_files(
    storage: Mapping[records.MetadataIndex, records.StorageInfo], entries: Mapping[str, Entry]
) -> list[Problem]:
    """Every file an item names that is unsafe, missing, not a regular file, or too short."""
    if _all_sound(storage, entries):
        return []
    by_file: dict[str, list[tuple[records.MetadataIndex, records.StorageInfo]]] = defaultdict(list)
    for index, info in storage.items():
        by_file[info.relative_path].append((index, info))
    problems = []
    for name in sorted(by_file):
        items = by_file[name]
        shown = canonical.printable(name)
        named = f"named by {_count(len(items), 'item')}, e.g. {_item(items[0][0])}"
        if not _plain_name(name):
            problems.append(
                Problem(
                    "unsafe path",
                    f"{shown!r} is not a plain file name inside the directory ({named}); "
                    "DCP writes flat names",
                )
            )
            continue
        entry = entries.get(name)
        if entry is None:
            problems.append(Problem("missing file", f"{shown} ({named})"))
            continue
        if not is_regular(entry):
            problems.append(Problem("not a regular file", f"{shown} is a {entry.kind} ({named})"))
            continue
        negative = [(i, s) for i, s in items if s.offset < 0 or s.length < 0]
        if negative:
            index, info = negative[0]
            problems.append(
                Problem(
                    "malformed metadata",
                    f"{_item(index)} in {shown}: offset {info.offset}, length {info.length}",
                )
            )
        short = [(i, s) for i, s in items if s.offset + s.length > entry.size]
        if short:
            index, info = max(short, key=lambda pair: pair[1].offset + pair[1].length)
            problems.append(
                Problem(
                    "truncated",
                    f"{shown} holds {entry.size} bytes; {_count(len(short), 'item')} "
                    f"{'lies' if len(short) == 1 else 'lie'} past its end, e.g. {_item(index)} "
                    f"at bytes {info.offset}..{info.offset + info.length}",
                )
            )
    return problems


def _all_sound(
    storage: Mapping[records.MetadataIndex, records.StorageInfo], entries: Mapping[str, Entry]
) -> bool:
    """Whether :func:`check_files` finds nothing: every file named a plain name of a regular
    file, every range inside it. Only then is the answer quick; otherwise it says what."""
    rows = records.StorageData.of(storage)
    paths = rows.paths()
    sizes: dict[str, int] = {}
    for name in set(paths):
        entry = entries.get(name)
        if not _plain_name(name) or entry is None or not is_regular(entry):
            return False
        sizes[name] = entry.size
    starts = rows.starts()
    lengths = rows.lengths()
    if paths and (min(starts) < 0 or min(lengths) < 0):
        return False
    ends = map(operator.add, starts, lengths)
    return not any(map(operator.gt, ends, map(sizes.__getitem__, paths)))


def _plain_name(name: str) -> bool:
    # No separator of any platform, no drive ("C:x"), nothing that names a parent or the
    # directory itself: the name can only mean an entry of the directory.
    return (
        name not in ("", ".", "..")
        and not any(c in name for c in "/\\:\0")
        and not os.path.isabs(name)
    )


def _item(index: records.MetadataIndex) -> str:
    if index.offset is None:
        return index.fqn
    return f"{index.fqn} at {_offsets(index.offset)}"


def _offsets(offsets: records.Shape) -> str:
    return tiling.shown(offsets)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
