"""The commit protocol: candidates are sealed, promoted to immutable generations, loaded via the pointer.

Layout under a store root::

    candidates/<label>/                 DCP writes here
    candidates/<label>.receipt.json     written by seal()
    generations/<receipt sha256>/       a promoted candidate, files read-only
    generations/<receipt sha256>.receipt.json
    pointer.json                        names the current generation

Peers commit by rename (orbax) or trust any directory holding ``.metadata`` (torchtitan); neither
hashes content (orbax ``checkpoint/_src/path/atomicity.py``; torchtitan's checkpointer). Here nothing reaches the
pointer, and nothing reaches ``dcp.load``, without matching its receipt byte for byte.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from dcp_invariant.commit import durable, pointer, receipt
from dcp_invariant.commit.errors import (
    PointerError,
    PromotionRefused,
    ReceiptError,
    StoreError,
)
from dcp_invariant.commit.receipt import Receipt

POINTER_FILE = "pointer.json"
RECEIPT_SUFFIX = ".receipt.json"
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


@dataclass(frozen=True)
class Generation:
    path: Path
    receipt: Receipt

    @property
    def digest(self) -> str:
        return self.receipt.digest


class CheckpointStore:
    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.candidates = self.root / "candidates"
        self.generations = self.root / "generations"
        self.pointer_path = self.root / POINTER_FILE

    def candidate(self, label: str) -> Path:
        """The directory DCP should write a new checkpoint into."""
        if not _LABEL.fullmatch(label) or label.endswith(RECEIPT_SUFFIX):
            raise StoreError(
                f"invalid checkpoint label {label!r}: use letters, digits, '.', '_' or '-' "
                f"(at most 100, not ending in {RECEIPT_SUFFIX})"
            )
        return self.candidates / label

    def seal(self, label: str) -> Receipt:
        """Inventory a finished candidate, make its files durable, and record its receipt beside it."""
        directory = self.candidate(label)
        receipt_path = self._receipt_path(label)
        if receipt_path.exists():
            raise StoreError(
                f"{label} is already sealed: promote it, or remove {receipt_path.name}"
            )
        sealed = receipt.seal(directory, label)
        for entry in sealed.files:
            durable.fsync(directory / entry.path)
        durable.fsync(directory)
        durable.replace_file(receipt_path, sealed.encode())
        return sealed

    def _receipt_path(self, label: str) -> Path:
        return self.candidates / f"{label}{RECEIPT_SUFFIX}"

    def promote(self, label: str) -> Generation:
        """Re-verify a sealed candidate, move it into ``generations/`` and only then move the pointer.

        Safe to call again after a crash: a candidate already moved into place is re-verified
        there and the promotion completes.
        """
        source = self.candidate(label)
        current = self.read_pointer()
        sealed = self._candidate_receipt(label)
        digest = sealed.digest
        target = self.generations / digest
        if target.exists():
            if source.exists():
                raise StoreError(f"generation {digest[:12]} already exists; {label} duplicates it")
            moved = receipt.check(target, sealed)
            if moved:
                raise PromotionRefused(label, moved)
        else:
            failures = receipt.check(source, sealed)
            if failures:
                raise PromotionRefused(label, failures)
            self.generations.mkdir(parents=True, exist_ok=True)
            durable.replace_file(self.generations / f"{digest}{RECEIPT_SUFFIX}", sealed.encode())
            os.replace(source, target)
            durable.fsync(self.generations)
            durable.fsync(self.candidates)
        # Also on the retry after a crash: the generation is immutable from here on.
        for path in target.iterdir():
            path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
        sequence = 1 if current is None else current.sequence + 1
        pointer.write(self.pointer_path, pointer.Pointer(label, digest, sequence))
        self._receipt_path(label).unlink(missing_ok=True)
        return Generation(target, sealed)

    def _candidate_receipt(self, label: str) -> Receipt:
        try:
            sealed = Receipt.decode(self._receipt_path(label).read_bytes())
        except FileNotFoundError as exc:
            raise StoreError(f"{label} has no receipt: seal it before promoting") from exc
        except ReceiptError as exc:
            raise StoreError(f"{label}: {exc}; seal the candidate again") from exc
        if sealed.label != label:
            raise StoreError(
                f"{label}: its receipt seals {sealed.label!r}; seal the candidate again"
            )
        return sealed

    def read_pointer(self) -> pointer.Pointer | None:
        try:
            return pointer.read(self.pointer_path)
        except PointerError as exc:
            raise StoreError(
                f"{POINTER_FILE} is damaged ({exc}); restore it from a generation"
            ) from exc

    def pointer_bytes(self) -> bytes | None:
        try:
            return self.pointer_path.read_bytes()
        except FileNotFoundError:
            return None

    def generation_names(self) -> list[str]:
        if not self.generations.is_dir():
            return []
        return sorted(p.name for p in self.generations.iterdir() if p.is_dir())

    def resolve(self) -> Generation:
        """The generation the pointer names, verified against its receipt before any byte is loaded.

        DCP unpickles ``.metadata`` (``FileSystemReader.read_metadata``, pytorch/pytorch #189308), so an unverified
        directory must never reach ``dcp.load``.
        """
        current = self.read_pointer()
        if current is None:
            raise StoreError(f"no {POINTER_FILE} in the store: nothing has been promoted yet")
        digest = current.receipt_sha256
        try:
            raw = (self.generations / f"{digest}{RECEIPT_SUFFIX}").read_bytes()
        except FileNotFoundError as exc:
            raise StoreError(f"generation {digest[:12]}: receipt is missing") from exc
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
        self.verify(generation)
        return generation

    def verify(self, generation: Generation) -> None:
        receipt.verify(
            generation.path, generation.receipt, what=f"generation {generation.digest[:12]}"
        )
