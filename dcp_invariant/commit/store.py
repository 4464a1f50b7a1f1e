"""The commit protocol: candidates are sealed, promoted to immutable generations, loaded via the pointer.

Layout under a store root::

    candidates/<label>/                 DCP writes here
    candidates/<label>.lineage.json     written by seal(): the pointer it was sealed on
    candidates/<label>.receipt.json     written by seal(), last: the candidate is sealed
    generations/<receipt sha256>/       a promoted candidate, files and directories read-only
    generations/<receipt sha256>.receipt.json
    generations/<receipt sha256>.lineage.json
    pointer.json                        names the current generation
    store.lock                          held while seal() and promote() write

Peers commit by rename (orbax) or trust any directory holding ``.metadata`` (torchtitan); neither
hashes content (orbax ``checkpoint/_src/path/atomicity.py``; torchtitan's checkpointer). Here nothing reaches the
pointer, and nothing reaches ``dcp.load``, without matching its receipt byte for byte.

Every write of the protocol happens under the store's lock, so a temporary file found while
holding it was left by a crash, never by a write in flight: the next seal or promote removes it.
Entries inside the store that are symlinks, FIFOs or devices are refused, never followed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dcp_invariant import regular_file
from dcp_invariant.commit import durable, lock, pointer, receipt
from dcp_invariant.commit.errors import (
    CommitError,
    LineageError,
    PointerError,
    PromotionRefused,
    ReceiptError,
    SealError,
    StaleParent,
    StoreError,
)
from dcp_invariant.commit.lineage import SUFFIX as LINEAGE_SUFFIX
from dcp_invariant.commit.lineage import Lineage
from dcp_invariant.commit.receipt import Receipt
from dcp_invariant.dcp_layout import METADATA_FILE

POINTER_FILE = "pointer.json"
LOCK_FILE = "store.lock"
RECEIPT_SUFFIX = ".receipt.json"
# Long enough to wait out another promotion hashing a large checkpoint twice.
LOCK_TIMEOUT_SECONDS = 600.0
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
_GENERATION_RECORD = re.compile(r"[0-9a-f]{64}(\.receipt\.json|\.lineage\.json)")
_WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


@dataclass(frozen=True)
class Generation:
    path: Path
    receipt: Receipt

    @property
    def digest(self) -> str:
        return self.receipt.digest


class CheckpointStore:
    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        lock_timeout: float = LOCK_TIMEOUT_SECONDS,
        marker: str | None = METADATA_FILE,
    ) -> None:
        """``marker``: the file a candidate's finished save writes last (:func:`.receipt.seal`)."""
        self.root = Path(root)
        self.marker = marker
        self.candidates = self.root / "candidates"
        self.generations = self.root / "generations"
        self.pointer_path = self.root / POINTER_FILE
        self.lock_path = self.root / LOCK_FILE
        self.lock_timeout = lock_timeout

    def candidate(self, label: str) -> Path:
        """The directory DCP should write a new checkpoint into."""
        if not _LABEL.fullmatch(label) or label.endswith((RECEIPT_SUFFIX, LINEAGE_SUFFIX)):
            raise StoreError(
                f"invalid checkpoint label {label!r}: use letters, digits, '.', '_' or '-' "
                f"(at most 100, not ending in {RECEIPT_SUFFIX} or {LINEAGE_SUFFIX})"
            )
        return self.candidates / label

    def seal(self, label: str) -> Receipt:
        """Inventory a finished candidate, make its files durable, and record its receipt beside it.

        The pointer at the time of sealing becomes the candidate's parent: if another promotion
        moves the pointer before this candidate is promoted, the promotion is refused as stale.
        """
        directory = self.candidate(label)
        self._root_exists()
        self._real_directory(self.candidates, SealError)
        self._real_directory(directory, SealError)
        self._refuse_sealed(label)
        sealed = receipt.seal(directory, label, self.marker)
        for entry in sealed.files:
            durable.fsync(directory / entry.path)
        # Each directory's entries, deepest first and the candidate's own last (a path sorts
        # before those it is a prefix of): a crash after the promotion's rename must not lose a
        # file whose name only a subdirectory's unflushed entries held (fsync(2): flushing a
        # file does not flush the entry naming it).
        for sub in reversed(sealed.directories):
            durable.fsync(directory / sub)
        durable.fsync(directory)
        with self._locked():
            self._remove_leftovers()
            self._real_directory(self.candidates, SealError)
            self._refuse_sealed(label)
            parent = self.read_pointer()
            durable.replace_file(
                self._lineage_path(label), Lineage.on(parent, sealed.digest, label).encode()
            )
            # The receipt last: its presence is what makes the candidate sealed.
            durable.replace_file(self._receipt_path(label), sealed.encode())
        return sealed

    def promote(self, label: str) -> Generation:
        """Move a sealed candidate into ``generations/``, verify it there, then move the pointer.

        The pointer moves only if it still is the one the candidate was sealed on (else
        :class:`StaleParent`; the generation stays on disk, unselected). Safe to call again after
        a crash: a candidate already moved is re-verified in place, and one whose generation the
        pointer already names only has its seal removed.
        """
        source = self.candidate(label)
        if not self._root_exists():
            raise StoreError(f"{label} has no receipt: seal it before promoting")
        with self._locked():
            self._remove_leftovers()
            return self._promote(label, source)

    def _promote(self, label: str, source: Path) -> Generation:
        self._real_directory(self.candidates, StoreError)
        current = self.read_pointer()
        sealed = self._candidate_receipt(label)
        if sealed is None:
            if (
                current is not None
                and current.label == label
                and not self._real_directory(source, StoreError)
                and not os.path.lexists(self._lineage_path(label))
            ):
                # A crash after the last step, removing the seal: the promotion is complete.
                return self.resolve()
            raise StoreError(f"{label} has no receipt: seal it before promoting")
        digest = sealed.digest
        target = self.generations / digest
        line = self._candidate_lineage(label, digest)
        if current is not None and (current.label, current.receipt_sha256) == (label, digest):
            # A crash after the pointer moved and before the seal was removed: finish the
            # cleanup instead of publishing the same generation again at the next sequence.
            published = self._generation_lineage(digest)
            if line is not None and line != published:
                raise self._reused(label, line, published)
            if published.pointer() != current:
                raise LineageError(
                    f"generation {digest[:12]}: the pointer names it at sequence "
                    f"{current.sequence}, its lineage at {published.sequence}"
                )
            self._finish(label)
            return Generation(target, sealed)
        if line is None:
            raise StoreError(
                f"{label} was sealed without a lineage record: remove "
                f"{label}{RECEIPT_SUFFIX} and seal it again"
            )
        self._real_directory(self.generations, StoreError)
        if self._real_directory(target, StoreError):
            published = self._generation_lineage(digest)
            if published != line:
                raise self._reused(label, line, published)
            if self._real_directory(source, StoreError):
                raise StoreError(f"generation {digest[:12]} already exists; {label} duplicates it")
        else:
            if not self._real_directory(source, StoreError):
                raise StoreError(f"candidates/{label} is missing: nothing to promote")
            failures = receipt.check(source, sealed)
            if failures:
                raise PromotionRefused(label, failures)
            if not self._real_directory(self.generations, StoreError):
                os.mkdir(self.generations)
                durable.fsync(self.root)
            durable.replace_file(self.generations / f"{digest}{RECEIPT_SUFFIX}", sealed.encode())
            durable.replace_file(self.generations / f"{digest}{LINEAGE_SUFFIX}", line.encode())
            os.rename(source, target)
            durable.fsync(self.generations)
            durable.fsync(self.candidates)
        # Also on the retry after a crash. Locked down first, so that no file can be opened for
        # writing once the check below has read it; what was written before, in the candidate
        # or through a handle opened before promotion, the check sees in the final place. A
        # handle still open can write on (no permission stops it): resolve() checks before and
        # after every load for that reason.
        _make_read_only(target, sealed)
        failures = receipt.check(target, sealed)
        if failures:
            raise PromotionRefused(label, failures)
        actual = self.read_pointer()
        if actual != line.parent:
            raise StaleParent(
                label, line.parent_digest, None if actual is None else actual.digest, digest
            )
        pointer.write(self.pointer_path, line.pointer())
        self._finish(label)
        return Generation(target, sealed)

    def _reused(self, label: str, line: Lineage, published: Lineage) -> LineageError:
        return LineageError(
            f"generation {line.generation[:12]} already exists under another lineage "
            f"(sequence {published.sequence}); {label} was sealed for sequence {line.sequence}: "
            "one receipt is never published twice"
        )

    def _finish(self, label: str) -> None:
        # The receipt last: one left by a crash here still lets the retry see that the
        # pointer already names its generation.
        for path in (self._lineage_path(label), self._receipt_path(label)):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        durable.fsync(self.candidates)

    def _receipt_path(self, label: str) -> Path:
        return self.candidates / f"{label}{RECEIPT_SUFFIX}"

    def _lineage_path(self, label: str) -> Path:
        return self.candidates / f"{label}{LINEAGE_SUFFIX}"

    def _candidate_receipt(self, label: str) -> Receipt | None:
        name = f"{label}{RECEIPT_SUFFIX}"
        raw = durable.read_bytes(self._receipt_path(label), f"candidates/{name}")
        if raw is None:
            return None
        try:
            sealed = Receipt.decode(raw)
        except ReceiptError as exc:
            raise StoreError(f"{label}: {exc}; seal the candidate again") from exc
        if sealed.label != label:
            raise StoreError(
                f"{label}: its receipt seals {sealed.label!r}; seal the candidate again"
            )
        return sealed

    def _candidate_lineage(self, label: str, digest: str) -> Lineage | None:
        shown = f"candidates/{label}{LINEAGE_SUFFIX}"
        raw = durable.read_bytes(self._lineage_path(label), shown)
        if raw is None:
            return None
        line = Lineage.decode(raw, what=shown)
        if (line.label, line.generation) != (label, digest):
            raise LineageError(
                f"{shown}: names {line.label!r} with receipt {line.generation[:12]}, not the "
                f"receipt {digest[:12]} beside it; seal the candidate again"
            )
        return line

    def _generation_lineage(self, digest: str) -> Lineage:
        shown = f"generation {digest[:12]}: lineage"
        raw = durable.read_bytes(self.generations / f"{digest}{LINEAGE_SUFFIX}", shown)
        if raw is None:
            raise LineageError(f"{shown} is missing")
        line = Lineage.decode(raw, what=shown)
        if line.generation != digest:
            raise LineageError(f"{shown}: names generation {line.generation[:12]}")
        return line

    def _refuse_sealed(self, label: str) -> None:
        path = self._receipt_path(label)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISREG(mode):
            raise StoreError(
                f"candidates/{path.name} is a {regular_file.kind(mode)}, not a regular file; remove it"
            )
        raise StoreError(f"{label} is already sealed: promote it, or remove {path.name}")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with lock.exclusive(self.lock_path, self.lock_timeout):
            yield

    def _remove_leftovers(self) -> None:
        """Remove what crashed writes of this protocol left; called with the lock held.

        Only this protocol's own names: temporaries of the pointer and of receipt and lineage
        records, and a candidate's lineage whose seal never got its receipt.
        """
        owners = (
            (self.root, lambda name: name == POINTER_FILE),
            (self.candidates, _candidate_record),
            (self.generations, lambda name: _GENERATION_RECORD.fullmatch(name) is not None),
        )
        for directory, owned in owners:
            if not _is_real_directory(directory):
                continue
            with os.scandir(directory) as it:
                entries = list(it)
            names = {e.name for e in entries}
            for entry in entries:
                if not entry.is_file(follow_symlinks=False):
                    continue
                final = durable.temporary_target(entry.name)
                orphan = (
                    directory == self.candidates
                    and entry.name.endswith(LINEAGE_SUFFIX)
                    and _candidate_record(entry.name)
                    and entry.name.removesuffix(LINEAGE_SUFFIX) + RECEIPT_SUFFIX not in names
                )
                if (final is not None and owned(final)) or orphan:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)

    def _root_exists(self) -> bool:
        try:
            mode = os.stat(self.root).st_mode
        except FileNotFoundError:
            return False
        except NotADirectoryError as exc:
            raise StoreError(f"store root {self.root}: a parent is not a directory") from exc
        if not stat.S_ISDIR(mode):
            raise StoreError(
                f"store root {self.root} is a {regular_file.kind(mode)}, not a directory"
            )
        return True

    def _real_directory(self, path: Path, error: type[CommitError]) -> bool:
        """Whether ``path`` is a directory; refuse a symlink or anything else standing there."""
        shown = path.relative_to(self.root).as_posix()
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return False
        except NotADirectoryError as exc:
            raise error(f"{shown}: a parent is not a directory") from exc
        if stat.S_ISLNK(mode):
            raise error(f"{shown} is a symlink; the store refuses entries that lead outside it")
        if not stat.S_ISDIR(mode):
            raise error(f"{shown} is a {regular_file.kind(mode)}, not a directory")
        return True

    def read_pointer(self) -> pointer.Pointer | None:
        self._root_exists()
        try:
            return pointer.read(self.pointer_path)
        except PointerError as exc:
            raise StoreError(
                f"{POINTER_FILE} is damaged ({exc}); restore it from a generation"
            ) from exc

    def pointer_bytes(self) -> bytes | None:
        self._root_exists()
        return durable.read_bytes(self.pointer_path, POINTER_FILE)

    def generation_names(self) -> list[str]:
        if not _is_real_directory(self.generations):
            return []
        with os.scandir(self.generations) as it:
            return sorted(e.name for e in it if e.is_dir(follow_symlinks=False))

    def resolve(self) -> Generation:
        """The generation the pointer names, verified against its receipt before any byte is loaded.

        DCP unpickles ``.metadata`` (``FileSystemReader.read_metadata``, pytorch/pytorch #189308), so an unverified
        directory must never reach ``dcp.load``.
        """
        current = self.read_pointer()
        if current is None:
            raise StoreError(f"no {POINTER_FILE} in the store: nothing has been promoted yet")
        digest = current.receipt_sha256
        raw = durable.read_bytes(
            self.generations / f"{digest}{RECEIPT_SUFFIX}", f"generation {digest[:12]}: receipt"
        )
        if raw is None:
            raise StoreError(f"generation {digest[:12]}: receipt is missing")
        if hashlib.sha256(raw).hexdigest() != digest:
            raise StoreError(
                f"generation {digest[:12]}: receipt does not match the pointer's digest"
            )
        try:
            generation = Generation(self.generations / digest, Receipt.decode(raw))
        except ReceiptError as exc:
            raise StoreError(f"generation {digest[:12]}: {exc}") from exc
        if generation.receipt.label != current.label:
            raise StoreError(
                f"generation {digest[:12]}: the pointer names {current.label!r}, "
                f"the receipt {generation.receipt.label!r}"
            )
        line = self._generation_lineage(digest)
        if line.pointer() != current:
            raise LineageError(
                f"generation {digest[:12]}: the pointer names it at sequence {current.sequence}, "
                f"its lineage at {line.sequence}"
            )
        self.verify(generation)
        return generation

    def verify(self, generation: Generation) -> None:
        self._real_directory(generation.path, StoreError)
        receipt.verify(
            generation.path, generation.receipt, what=f"generation {generation.digest[:12]}"
        )


def _candidate_record(name: str) -> bool:
    for suffix in (RECEIPT_SUFFIX, LINEAGE_SUFFIX):
        if name.endswith(suffix):
            return _LABEL.fullmatch(name.removesuffix(suffix)) is not None
    return False


def _is_real_directory(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _make_read_only(directory: Path, sealed: Receipt) -> None:
    """Clear the write bits of a generation's regular files, then of its directories, deepest
    first, the generation's own last.

    Through descriptors opened without following symlinks, so nothing outside the store is ever
    changed; only the directories the receipt lists are entered, and only when ``lstat`` shows a
    directory there; entries of any other kind are left for the receipt check to refuse.
    """
    directories = [d for d in sealed.directories if _is_real_directory(directory / d)]
    files = []
    for sub in ("", *directories):
        with os.scandir(directory / sub) as it:
            prefix = f"{sub}/" if sub else ""
            files += [prefix + e.name for e in it if e.is_file(follow_symlinks=False)]
    for name in sorted(files):
        _clear_write_bits(directory / name, directory=False)
    for sub in reversed(directories):
        _clear_write_bits(directory / sub, directory=True)
    _clear_write_bits(directory, directory=True)


def _clear_write_bits(path: Path, *, directory: bool) -> None:
    if sys.platform == "win32":
        # Windows has no write bits for directories: FILE_ATTRIBUTE_READONLY "is not honored on
        # directories" (Microsoft's File Attribute Constants), so only the files are marked.
        if not directory:
            os.chmod(path, stat.S_IMODE(os.lstat(path).st_mode) & ~_WRITE_BITS)
        return
    flags = os.O_RDONLY | regular_file.NOFOLLOW | regular_file.NONBLOCK
    fd = os.open(path, flags | (os.O_DIRECTORY if directory else 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode):
            os.fchmod(fd, stat.S_IMODE(mode) & ~_WRITE_BITS)
    finally:
        os.close(fd)
