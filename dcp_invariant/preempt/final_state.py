"""The state a job leaves at its end (``--final``), compared bit for bit between two runs,
without torch: a DCP checkpoint and a safetensors file tensor by tensor, so the first tensor
that differs is named; anything else byte for byte.

A DCP checkpoint's items are found through its ``.metadata``, read by the inspection module,
which never runs the pickle (dcp_invariant/inspection/metadata.py); each item's bytes lie at
``storage_data[index]`` (``_StorageInfo`` in torch/distributed/checkpoint/filesystem.py). A
safetensors file is an 8-byte little-endian header length, a JSON header of
``name: {dtype, shape, data_offsets}``, then the data (the format's own specification).
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path

from dcp_invariant.inspection import metadata as dcp_metadata
from dcp_invariant.inspection.errors import MetadataProblem

METADATA_FILE = ".metadata"
# A safetensors header over this is not a header (the format caps it at 100 MB).
_MAX_HEADER = 100 << 20
_CHUNK = 1 << 20


def first_difference(expected: Path, got: Path) -> str | None:
    """Where ``got`` first differs from ``expected``, named relative to them; None if equal."""
    if expected.is_dir() != got.is_dir() or not got.exists():
        return "it is missing" if not got.exists() else "one is a directory, the other not"
    if expected.is_dir():
        return _directories(expected, got, "")
    return _file(expected, got, expected.name)


def _directories(expected: Path, got: Path, prefix: str) -> str | None:
    covered: set[str] = set()
    if (expected / METADATA_FILE).is_file():
        found, covered = _dcp(expected, got)
        if found is not None:
            return f"{prefix}{found}"
    # A DCP checkpoint's .metadata holds its own path and a fresh UUID (StorageMeta in
    # torch/distributed/checkpoint/metadata.py), so once every item's bytes are equal it and the
    # data files are not compared as bytes again.
    theirs, ours = _files(expected) - covered, _files(got) - covered
    for name in sorted(theirs | ours):
        if name not in ours:
            return f"{prefix}{name}: missing"
        if name not in theirs:
            return f"{prefix}{name}: not in the uninterrupted run's"
        found = _file(expected / name, got / name, name)
        if found is not None:
            return f"{prefix}{found}"
    return None


def _files(root: Path) -> set[str]:
    return {
        str(Path(directory, name).relative_to(root))
        for directory, _, names in os.walk(root)
        for name in names
    }


def _file(expected: Path, got: Path, name: str) -> str | None:
    if name.endswith(".safetensors"):
        found = _safetensors(expected, got)
        if found is not None:
            return f"{name}: {found}"
    return None if _same_bytes(expected, got) else f"{name}: its bytes differ"


def _dcp(expected: Path, got: Path) -> tuple[str | None, set[str]]:
    """The first item, by FQN, whose stored bytes differ, and the files the items cover
    (``.metadata`` and the data files): none where this reader cannot follow the checkpoint,
    which is then compared byte for byte."""
    try:
        theirs = dcp_metadata.read(expected / METADATA_FILE).storage_data
        ours = dcp_metadata.read(got / METADATA_FILE).storage_data
    except (MetadataProblem, OSError):
        return None, set()
    if theirs is None or ours is None:
        return None, set()
    left = {(k.fqn, k.offset): v for k, v in theirs.items()}
    right = {(k.fqn, k.offset): v for k, v in ours.items()}
    for key in sorted(left.keys() | right.keys(), key=lambda k: (k[0], str(k[1]))):
        fqn = key[0]
        if key not in right or key not in left:
            return f"{fqn}: saved in one run only", set()
        a, b = left[key], right[key]
        if _read(expected / a.relative_path, a.offset, a.length) != _read(
            got / b.relative_path, b.offset, b.length
        ):
            return f"{fqn}: its saved bytes differ", set()
    files = {v.relative_path for v in left.values()} | {v.relative_path for v in right.values()}
    return None, files | {METADATA_FILE}


def _safetensors(expected: Path, got: Path) -> str | None:
    theirs, ours = _tensors(expected), _tensors(got)
    if theirs is None or ours is None:
        return None
    for name in sorted(theirs.keys() | ours.keys()):
        if name not in theirs or name not in ours:
            return f"tensor {name!r}: in one run only"
        if theirs[name] != ours[name]:
            return f"tensor {name!r}: its dtype, shape or bytes differ"
    return None


def _tensors(path: Path) -> dict[str, tuple[str, str, bytes]] | None:
    """Each tensor's dtype, shape and bytes; None if ``path`` is not a safetensors file."""
    with path.open("rb") as file:
        head = file.read(8)
        if len(head) != 8:
            return None
        (length,) = struct.unpack("<Q", head)
        if length > _MAX_HEADER:
            return None
        try:
            header = json.loads(file.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
        if not isinstance(header, dict):
            return None
        start = 8 + length
        tensors = {}
        for name, entry in header.items():
            if name == "__metadata__" or not isinstance(entry, dict):
                continue
            begin, end = entry.get("data_offsets", (0, 0))
            tensors[name] = (
                str(entry.get("dtype")),
                str(entry.get("shape")),
                _read(path, start + int(begin), int(end) - int(begin)),
            )
        return tensors


def _read(path: Path, offset: int, length: int) -> bytes:
    with path.open("rb") as file:
        file.seek(offset)
        return file.read(length)


def _same_bytes(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    return all(x == y for x, y in zip(_chunks(a), _chunks(b), strict=False))


def _chunks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as file:
        while chunk := file.read(_CHUNK):
            yield chunk
