"""The generation pointer: a small canonical record, replaced atomically or not at all."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from dcp_invariant import canonical
from dcp_invariant.commit import durable
from dcp_invariant.commit.errors import PointerError

SCHEMA = "dcp-invariant/pointer/1"


@dataclass(frozen=True)
class Pointer:
    label: str
    receipt_sha256: str
    sequence: int

    @property
    def digest(self) -> str:
        """SHA-256 of the record's bytes: what a generation built on this pointer names as parent."""
        return hashlib.sha256(self.encode()).hexdigest()

    def encode(self) -> bytes:
        return canonical.dumps(
            {
                "generation": self.receipt_sha256,
                "label": self.label,
                "schema": SCHEMA,
                "sequence": self.sequence,
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> Pointer:
        try:
            record = canonical.loads(raw, what="pointer")
        except canonical.CanonicalJSONError as exc:
            raise PointerError(str(exc)) from exc
        if not isinstance(record, dict) or set(record) != {
            "generation",
            "label",
            "schema",
            "sequence",
        }:
            raise PointerError(
                "pointer: expected exactly the keys generation, label, schema, sequence"
            )
        if record["schema"] != SCHEMA:
            raise PointerError(f"pointer: unknown schema {record['schema']!r}, expected {SCHEMA!r}")
        gen, label, seq = record["generation"], record["label"], record["sequence"]
        if not isinstance(gen, str) or not canonical.HEX64.fullmatch(gen):
            raise PointerError("pointer: generation must be a 64-hex receipt digest")
        if (
            not isinstance(label, str)
            or not isinstance(seq, int)
            or isinstance(seq, bool)
            or seq < 1
        ):
            raise PointerError("pointer: label must be a string and sequence a positive integer")
        return cls(label, gen, seq)


def read(path: Path) -> Pointer | None:
    """The pointer at ``path``; ``None`` if there is none; a StoreError if it is not a regular file."""
    raw = durable.read_bytes(path, path.name)
    return None if raw is None else Pointer.decode(raw)


def write(path: Path, pointer: Pointer) -> None:
    """Replace ``path`` with ``pointer`` so a reader sees the old record or the new one, never a mix."""
    durable.replace_file(path, pointer.encode())
