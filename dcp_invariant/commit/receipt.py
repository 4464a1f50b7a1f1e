"""Inventory receipts: what a sealed checkpoint directory must contain, byte for byte.

DCP records offsets and lengths but no content hash, and happily loads a truncated ``.distcp``
as long as ``.metadata`` exists (``torch/distributed/checkpoint/filesystem.py``: items carry
``relative_path``, ``offset`` and ``length`` only; pytorch/torchtitan RFC #4011 proposed a manifest). A receipt closes that
gap: every regular file's relative path, size and SHA-256, in a canonical record whose own
SHA-256 names the generation it seals.

DCP writes a flat directory (``FileSystemWriter`` puts every file straight into its path), so a
DCP save is sealed flat, as it always was. An app that saves itself writes what its framework
writes, often a tree (Accelerate's sharded FSDP ``save_state``: ``pytorch_model_fsdp_0/`` and
``optimizer_0/``, each of DCP files, in accelerate/utils/fsdp_utils.py; DeepSpeed:
``global_step<N>/``): its receipt also lists every directory, so that an empty one the app's
load may expect is reproduced and checked like a file. A receipt without a directory is written
as schema ``/1``, byte for byte as before trees were sealed, so no published digest changes; one
with a directory as ``/2``, which adds the ``directories`` key. Each receipt has one encoding.
"""

from __future__ import annotations

import hashlib
import ntpath
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
from dcp_invariant.plan import FailureReason

SCHEMA = "dcp-invariant/receipt/1"  # a flat directory of regular files
SCHEMA_NESTED = "dcp-invariant/receipt/2"  # with subdirectories, listed under "directories"
_KEYS = {
    SCHEMA: {"files", "label", "schema"},
    SCHEMA_NESTED: {"directories", "files", "label", "schema"},
}
# How deep an app's save may nest directories below the checkpoint's root. Frameworks nest one
# or two levels (above); the bound keeps every path, and so every receipt, of bounded length.
MAX_DEPTH = 16
# As many directories as files: enough for one directory per file.
MAX_DIRECTORIES = MAX_FILES
_REGULAR_ONLY = "a checkpoint may hold regular files only"
_REGULAR_OR_DIRECTORY = "a checkpoint may hold regular files and directories only"


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative to the checkpoint's root, segments separated by "/"
    size: int
    sha256: str


@dataclass(frozen=True)
class Receipt:
    label: str
    files: tuple[FileEntry, ...]
    # Every subdirectory, relative and sorted, empty ones included; () for a flat checkpoint.
    directories: tuple[str, ...] = ()

    def to_record(self) -> dict[str, object]:
        record: dict[str, object] = {
            "files": [{"path": f.path, "sha256": f.sha256, "size": f.size} for f in self.files],
            "label": self.label,
            "schema": SCHEMA,
        }
        if self.directories:
            record.update(directories=list(self.directories), schema=SCHEMA_NESTED)
        return record

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
        if not isinstance(record, dict) or set(record) not in _KEYS.values():
            raise ReceiptError(
                "receipt: expected exactly the keys files, label, schema "
                "(and directories, from schema /2)"
            )
        schema = record["schema"]
        if schema not in _KEYS:
            raise ReceiptError(
                f"receipt: unknown schema {schema!r}, expected {SCHEMA!r} or {SCHEMA_NESTED!r}"
            )
        if set(record) != _KEYS[schema]:
            raise ReceiptError(
                f"receipt: schema {schema!r} has exactly the keys {', '.join(sorted(_KEYS[schema]))}"
            )
        nested = schema == SCHEMA_NESTED
        directories = record.get("directories", [])
        if (
            not isinstance(record["label"], str)
            or not isinstance(record["files"], list)
            or not isinstance(directories, list)
        ):
            raise ReceiptError("receipt: label must be a string, files and directories lists")
        if nested and not directories:
            # Else one receipt would have two encodings, and two digests.
            raise ReceiptError(
                f"receipt: {SCHEMA_NESTED!r} lists directories; a flat one is {SCHEMA!r}"
            )
        for item in directories:
            if not _valid_path(item, MAX_DEPTH):
                raise ReceiptError(f"receipt: malformed directory entry {item!r}")
        files = []
        for item in record["files"]:
            if (
                not isinstance(item, dict)
                or set(item) != {"path", "sha256", "size"}
                or not _valid_path(item["path"], MAX_DEPTH + 1 if nested else 1)
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
        if directories != sorted(set(directories)):
            raise ReceiptError("receipt: directory entries must be unique and sorted by path")
        _refuse_orphans(paths, directories)
        return cls(record["label"], tuple(files), tuple(directories))


def _refuse_orphans(files: list[str], directories: list[str]) -> None:
    """Every entry's parent is the root or a listed directory, and no path is both kinds: the
    receipt describes one tree, which a check can walk from the root down."""
    listed = set(directories)
    clash = listed.intersection(files)
    if clash:
        raise ReceiptError(f"receipt: {min(clash)!r} is listed as a file and as a directory")
    for path in (*directories, *files):
        parent = path.rpartition("/")[0]
        if parent and parent not in listed:
            raise ReceiptError(f"receipt: {path!r} lies in {parent!r}, which is not listed")


def hash_file(path: Path, shown: str | None = None) -> tuple[int, str]:
    """Size and SHA-256 of a file, read in fixed chunks so memory does not grow with size.

    Whatever the caller saw, the entry may have been swapped since: :mod:`regular_file` refuses
    it unless what it opened is a regular file. ``shown``: how the error names it (by default
    its file name; a nested file by its path relative to the checkpoint).
    """
    h = hashlib.sha256()
    size = 0
    try:
        for chunk in regular_file.chunks(path):
            h.update(chunk)
            size += len(chunk)
    except regular_file.NotRegularFile as exc:
        name = canonical.printable(path.name if shown is None else shown)
        raise SealError(f"{name}: is a {exc.kind}; {_REGULAR_ONLY}") from exc
    return size, h.hexdigest()


def seal(directory: Path, label: str, marker: str | None = METADATA_FILE) -> Receipt:
    """Inventory ``directory``: with ``marker``, a flat set of regular files holding it; without,
    a tree of regular files and directories holding at least one file.

    ``marker``: the file a finished save writes last, DCP's ``.metadata``; None for a save
    whose end only its caller knows (an app's own, returned on every rank), which must still
    have written something. DCP writes no subdirectory, so one in its save is refused.
    """
    names, directories = _tree(directory, nested=marker is None)
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
    if len(directories) > MAX_DIRECTORIES:
        raise SealError(
            f"{label}: the save made {len(directories)} directories; a checkpoint may hold at "
            f"most {MAX_DIRECTORIES}"
        )
    entries = []
    for name in names:
        size, sha = hash_file(directory / name, name)
        entries.append(FileEntry(name, size, sha))
    return Receipt(label, tuple(entries), tuple(directories))


def check(directory: Path, receipt: Receipt) -> list[Failure]:
    """Every way ``directory`` differs from ``receipt``; empty when it matches exactly.

    Walks down only into directories the receipt lists, and only once ``lstat`` has shown a
    directory there: a symlink, or anything else standing where a directory should, is not
    followed, and whatever the receipt lists under it is missing.
    """
    try:
        top = _entries(directory)
    except FileNotFoundError:
        return [Failure(".", "missing")]
    expected = {f.path: f for f in receipt.files}
    subdirectories = set(receipt.directories)
    unexpected: list[str] = []
    found: dict[str, FailureReason | None] = {}
    pending = [("", top)]
    while pending:
        prefix, entries = pending.pop()
        for entry in entries:
            rel = prefix + entry.name
            st = entry.stat(follow_symlinks=False)
            if rel in expected:
                found[rel] = _file_failure(directory / rel, st, expected[rel])
            elif rel in subdirectories:
                found[rel] = "missing"  # unless it is a directory that can be listed
                if stat.S_ISDIR(st.st_mode):
                    try:
                        pending.append((f"{rel}/", _entries(directory / rel)))
                        found[rel] = None
                    except (FileNotFoundError, NotADirectoryError):
                        pass  # swapped since its lstat: not the directory the receipt lists
            else:
                unexpected.append(canonical.printable(rel))
    failures = [Failure(path, "unexpected") for path in sorted(unexpected)]
    for path in sorted({*expected, *subdirectories}):
        reason = found.get(path, "missing")
        if reason is not None:
            failures.append(Failure(path, reason))
    return failures


def verify(directory: Path, receipt: Receipt, *, what: str) -> None:
    failures = check(directory, receipt)
    if failures:
        raise ReceiptMismatch(what, failures)


def _file_failure(path: Path, st: os.stat_result, entry: FileEntry) -> FailureReason | None:
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_size != entry.size:
        return "size"  # without reading it
    try:
        size, sha = hash_file(path)
    except SealError:
        return "not a regular file"
    except (FileNotFoundError, NotADirectoryError):
        return "missing"  # removed, or a parent swapped, since the walk saw it
    if size != entry.size:
        return "size"
    if sha != entry.sha256:
        return "digest"
    return None


def _entries(directory: Path) -> list[os.DirEntry[str]]:
    """A directory's entries in name order: the first refusal, which the evidence records, is
    the same in every run whatever order the file system lists them in."""
    with os.scandir(directory) as it:
        return sorted(it, key=lambda e: e.name)


def _tree(directory: Path, *, nested: bool) -> tuple[list[str], list[str]]:
    """The regular files and (``nested``) directories under ``directory``, as sorted relative
    paths; a one-line refusal for anything else. Symlinks are refused, never followed."""
    try:
        top = _entries(directory)
    except FileNotFoundError as exc:
        raise SealError(f"{directory.name}: directory does not exist") from exc
    files: list[str] = []
    directories: list[str] = []
    pending = [("", top)]
    while pending:
        prefix, entries = pending.pop()
        for entry in entries:
            rel = prefix + entry.name
            mode = entry.stat(follow_symlinks=False).st_mode
            shown = canonical.printable(rel)
            if stat.S_ISDIR(mode) and nested:
                depth = rel.count("/") + 1
                if depth > MAX_DEPTH:
                    raise SealError(
                        f"{shown}: a directory {depth} levels deep; a checkpoint's directories "
                        f"may nest at most {MAX_DEPTH} levels"
                    )
            elif not stat.S_ISREG(mode):
                raise unsealable(shown, regular_file.kind(mode), nested=nested)
            if shown != rel:
                raise SealError(
                    f"{shown}: file name is not valid UTF-8; a checkpoint's names are text"
                )
            if not _valid_path(rel, MAX_DEPTH + 1):
                raise SealError(
                    f"{shown}: a name with a backslash or a drive (C:) would lead outside the "
                    "checkpoint on Windows; rename it"
                )
            if stat.S_ISDIR(mode):
                directories.append(rel)
                pending.append((f"{rel}/", _subdirectory(directory, rel)))
            else:
                files.append(rel)
    return sorted(files), sorted(directories)


def unsealable(shown: str, kind: str, *, nested: bool) -> SealError:
    """The seal's refusal of an entry of ``kind`` (a symlink, FIFO, socket or device) at the
    relative path ``shown``; ``nested``: the candidate may hold directories (an app's save)."""
    allowed = _REGULAR_OR_DIRECTORY if nested else _REGULAR_ONLY
    return SealError(f"{shown}: is a {kind}; {allowed}")


def _subdirectory(directory: Path, rel: str) -> list[os.DirEntry[str]]:
    try:
        return _entries(directory / rel)
    except (FileNotFoundError, NotADirectoryError) as exc:
        raise SealError(
            f"{canonical.printable(rel)}: changed while it was being sealed; save() must have "
            "finished writing when it returns"
        ) from exc


def _valid_path(path: object, max_segments: int) -> bool:
    """A relative path that stays inside the checkpoint's root on every platform: ``/``
    between segments, none empty, ``.`` or ``..``; no backslash (a separator on Windows), NUL
    or undecodable byte; no drive (``C:x`` is relative to another root on Windows)."""
    if not isinstance(path, str) or "\\" in path or "\0" in path:
        return False
    if canonical.printable(path) != path or ntpath.splitdrive(path)[0]:
        return False
    segments = path.split("/")
    return len(segments) <= max_segments and all(s not in ("", ".", "..") for s in segments)
