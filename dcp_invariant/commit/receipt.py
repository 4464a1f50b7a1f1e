"""Inventory receipts: what a sealed checkpoint directory must contain, byte for byte.

DCP records offsets and lengths but no content hash, and happily loads a truncated ``.distcp``
as long as ``.metadata`` exists (``torch/distributed/checkpoint/filesystem.py``: items carry
``relative_path``, ``offset`` and ``length`` only; pytorch/torchtitan RFC #4011 proposed a manifest). A receipt closes that
gap: every regular file's relative path, size and SHA-256, in a canonical record whose own
SHA-256 names the generation it seals.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from dcp_invariant import canonical, regular_file
from dcp_invariant.commit.errors import Failure, ReceiptError, ReceiptMismatch, SealError
from dcp_invariant.dcp_layout import (
    MAX_FILES,
    METADATA_FILE,  # DCP's only commit marker
)

SCHEMA = "dcp-invariant/receipt/1"
_REGULAR_ONLY = "a checkpoint may hold regular files only"


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class Receipt:
    label: str
    files: tuple[FileEntry, ...]

    def to_record(self) -> dict[str, object]:
        return {
            "files": [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in self.files],
            "label": self.label,
            "schema": SCHEMA,
        }

    def encode(self) -> bytes:
        return canonical.dumps(self.to_record())

    @property
    def digest(self) -> str:
        return hashlib.sha256(self.encode()).hexdigest()

    @classmethod
    def decode(cls, raw: bytes) -> Receipt:
        try:
            record = canonical.loads(raw, what="receipt")
        except canonical.CanonicalJSONError as exc:
            raise ReceiptError(str(exc)) from exc
        if not isinstance(record, dict) or set(record) != {"files", "label", "schema"}:
            raise ReceiptError("receipt: expected exactly the keys files, label, schema")
        if record["schema"] != SCHEMA:
            raise ReceiptError(f"receipt: unknown schema {record['schema']!r}, expected {SCHEMA!r}")
        if not isinstance(record["label"], str) or not isinstance(record["files"], list):
            raise ReceiptError("receipt: label must be a string and files a list")
        files = []
        for item in record["files"]:
            if (
                not isinstance(item, dict)
                or set(item) != {"path", "sha256", "size"}
                or not _valid_name(item["path"])
                or not isinstance(item["size"], int)
                or isinstance(item["size"], bool)
                or item["size"] < 0
                or not isinstance(item["sha256"], str)
                or not canonical.HEX64.fullmatch(item["sha256"])
            ):
                raise ReceiptError(f"receipt: malformed file entry {item!r}")
            files.append(FileEntry(item["path"], item["size"], item["sha256"]))
        paths = [f.path for f in files]
        if paths != sorted(set(paths)):
            raise ReceiptError("receipt: file entries must be unique and sorted by path")
        return cls(record["label"], tuple(files))


def hash_file(path: Path) -> tuple[int, str]:
    """Size and SHA-256 of a file, read in fixed chunks so memory does not grow with size.

    Whatever the caller saw, the entry may have been swapped since: :mod:`regular_file` refuses
    it unless what it opened is a regular file.
    """
    h = hashlib.sha256()
    size = 0
    try:
        for chunk in regular_file.chunks(path):
            h.update(chunk)
            size += len(chunk)
    except regular_file.NotRegularFile as exc:
        raise SealError(
            f"{canonical.printable(path.name)}: is a {exc.kind}; {_REGULAR_ONLY}"
        ) from exc
    return size, h.hexdigest()


def seal(directory: Path, label: str, marker: str | None = METADATA_FILE) -> Receipt:
    """Inventory ``directory``; refuse anything but a flat set of regular files with ``marker``.

    ``marker``: the file a finished save writes last, DCP's ``.metadata``; None for a save
    whose end only its caller knows (an app's own, returned on every rank), which must still
    have written something.
    """
    names = _regular_files(directory)
    if marker is not None and marker not in names:
        raise SealError(
            f"{label}: no {marker}; the save did not finish (DCP writes it last), "
            "so this candidate cannot be sealed"
        )
    if not names:
        raise SealError(f"{label}: the save wrote no file, so there is nothing to seal")
    if len(names) > MAX_FILES:
        raise SealError(
            f"{label}: the save wrote {len(names)} files; a checkpoint may hold at most {MAX_FILES}"
        )
    entries = []
    for name in names:
        size, sha = hash_file(directory / name)
        entries.append(FileEntry(name, size, sha))
    return Receipt(label, tuple(entries))


def check(directory: Path, receipt: Receipt) -> list[Failure]:
    """Every way ``directory`` differs from ``receipt``; empty when it matches exactly."""
    try:
        present = {e.name: e for e in os.scandir(directory)}
    except FileNotFoundError:
        return [Failure(".", "missing")]
    failures: list[Failure] = []
    expected = {f.path: f for f in receipt.files}
    for name in sorted(set(present) - set(expected)):
        failures.append(Failure(canonical.printable(name), "unexpected"))
    for name, entry in sorted(expected.items()):
        found = present.get(name)
        if found is None:
            failures.append(Failure(name, "missing"))
            continue
        st = found.stat(follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode):
            failures.append(Failure(name, "not a regular file"))
            continue
        if st.st_size != entry.size:
            failures.append(Failure(name, "size"))
            continue
        try:
            size, sha = hash_file(directory / name)
        except SealError:
            failures.append(Failure(name, "not a regular file"))
            continue
        if size != entry.size:
            failures.append(Failure(name, "size"))
        elif sha != entry.sha256:
            failures.append(Failure(name, "digest"))
    return failures


def verify(directory: Path, receipt: Receipt, *, what: str) -> None:
    failures = check(directory, receipt)
    if failures:
        raise ReceiptMismatch(what, failures)


def _regular_files(directory: Path) -> list[str]:
    try:
        entries = list(os.scandir(directory))
    except FileNotFoundError as exc:
        raise SealError(f"{directory.name}: directory does not exist") from exc
    names = []
    for entry in entries:
        st = entry.stat(follow_symlinks=False)
        shown = canonical.printable(entry.name)
        if not stat.S_ISREG(st.st_mode):
            raise SealError(f"{shown}: is a {regular_file.kind(st.st_mode)}; {_REGULAR_ONLY}")
        if shown != entry.name:
            raise SealError(f"{shown}: file name is not valid UTF-8; a checkpoint's names are text")
        names.append(entry.name)
    return sorted(names)


def _valid_name(name: object) -> bool:
    return (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
    )
