"""Lineage: which pointer a generation was built on, and the sequence it will have when published.

``seal`` records the pointer it saw as the candidate's parent; ``promote`` moves the pointer only
if it still is that parent, under the store's lock: publication is a compare-and-swap, as
``git push`` refuses a non-fast-forward. Without it, two writers promoting at once both succeed
and one promotion silently replaces the other.

The record keeps the parent pointer itself, not only its digest, so a forged or damaged digest,
and a sequence that does not follow its parent, are refused on reading, before any comparison.
"""

from __future__ import annotations

from dataclasses import dataclass

from dcp_invariant import canonical
from dcp_invariant.commit.errors import LineageError, PointerError
from dcp_invariant.commit.pointer import Pointer

SCHEMA = "dcp-invariant/lineage/1"
SUFFIX = ".lineage.json"


@dataclass(frozen=True)
class Lineage:
    generation: str  # the receipt digest: the generation's name
    label: str
    parent: Pointer | None  # None: built on an empty store
    sequence: int

    @classmethod
    def on(cls, parent: Pointer | None, generation: str, label: str) -> Lineage:
        return cls(generation, label, parent, 1 if parent is None else parent.sequence + 1)

    @property
    def parent_digest(self) -> str | None:
        return None if self.parent is None else self.parent.digest

    def pointer(self) -> Pointer:
        """The pointer that publishes this generation."""
        return Pointer(self.label, self.generation, self.sequence)

    def encode(self) -> bytes:
        parent = None
        if self.parent is not None:
            parent = {
                "generation": self.parent.receipt_sha256,
                "label": self.parent.label,
                "sequence": self.parent.sequence,
                "sha256": self.parent.digest,
            }
        return canonical.dumps(
            {
                "generation": self.generation,
                "label": self.label,
                "parent": parent,
                "schema": SCHEMA,
                "sequence": self.sequence,
            }
        )

    @classmethod
    def decode(cls, raw: bytes, *, what: str = "lineage") -> Lineage:
        try:
            record = canonical.loads(raw, what=what)
        except canonical.CanonicalJSONError as exc:
            raise LineageError(str(exc)) from exc
        keys = {"generation", "label", "parent", "schema", "sequence"}
        if not isinstance(record, dict) or set(record) != keys:
            raise LineageError(f"{what}: expected exactly the keys {', '.join(sorted(keys))}")
        if record["schema"] != SCHEMA:
            raise LineageError(f"{what}: unknown schema {record['schema']!r}, expected {SCHEMA!r}")
        try:
            # The pointer's own rules for a generation digest, a label and a sequence.
            this = Pointer.decode(
                Pointer(record["label"], record["generation"], record["sequence"]).encode()
            )
        except (PointerError, TypeError, ValueError) as exc:
            raise LineageError(f"{what}: malformed generation, label or sequence") from exc
        parent = record["parent"]
        if parent is None:
            if this.sequence != 1:
                raise LineageError(
                    f"{what}: sequence {this.sequence} does not follow its parent: "
                    "without a parent it must be 1"
                )
            return cls(this.receipt_sha256, this.label, None, this.sequence)
        if not isinstance(parent, dict) or set(parent) != {
            "generation",
            "label",
            "sequence",
            "sha256",
        }:
            raise LineageError(
                f"{what}: parent must be null or exactly generation, label, sequence, sha256"
            )
        try:
            before = Pointer.decode(
                Pointer(parent["label"], parent["generation"], parent["sequence"]).encode()
            )
        except (PointerError, TypeError, ValueError) as exc:
            raise LineageError(f"{what}: malformed parent pointer") from exc
        if parent["sha256"] != before.digest:
            raise LineageError(
                f"{what}: forged parent digest: {str(parent['sha256'])[:12]} is not the digest "
                f"of the parent pointer it names ({before.digest[:12]})"
            )
        if this.sequence != before.sequence + 1:
            raise LineageError(
                f"{what}: sequence {this.sequence} does not follow its parent's {before.sequence}"
            )
        return cls(this.receipt_sha256, this.label, before, this.sequence)
