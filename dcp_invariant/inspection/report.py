"""What ``inspect`` found, as a record (``--json``, canonical) and as a short summary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from dcp_invariant import canonical
from dcp_invariant.inspection import estimate, tiling
from dcp_invariant.inspection.generation import ReceiptCheck
from dcp_invariant.inspection.problems import Problem

SCHEMA: Final = "dcp-invariant/inspect/1"
# Keys the summary names of those every rank reads; --json lists them all.
_SHOWN_KEYS: Final = 4


@dataclass(frozen=True)
class Contents:
    """What the metadata describes, and the files it names."""

    keys: int
    tensors: int
    byte_items: int
    chunks: int
    stored_bytes: int  # the lengths of all items
    files: tuple[
        tuple[str, int | None], ...
    ]  # the files the items name and their sizes (None: absent)
    version: str | None


@dataclass(frozen=True)
class Inspection:
    directory: str
    contents: Contents | None  # None when .metadata could not be read
    receipt: ReceiptCheck | None  # None: not a dcp-invariant generation or sealed candidate
    estimate: estimate.Estimate | None  # None without --world-size
    problems: tuple[Problem, ...]

    @property
    def sound(self) -> bool:
        return not self.problems

    def to_record(self) -> dict[str, Any]:
        return {
            "contents": None if self.contents is None else _contents(self.contents),
            "directory": canonical.printable(self.directory),
            "estimate": None if self.estimate is None else _estimate(self.estimate),
            "problems": [str(p) for p in self.problems],
            "receipt": None if self.receipt is None else _receipt(self.receipt),
            "schema": SCHEMA,
            "sound": self.sound,
        }

    def lines(self) -> list[str]:
        lines = [f"checkpoint: {canonical.shown(canonical.printable(self.directory))}"]
        c = self.contents
        if c is not None:
            lines.append(
                f"keys: {c.keys} ({c.tensors} tensors in {c.chunks} chunks, "
                f"{c.byte_items} byte items); DCP metadata version {c.version or 'none'}"
            )
            on_disk = sum(size or 0 for _, size in c.files)
            files = len(c.files)
            lines.append(
                f"bytes: {_size(c.stored_bytes)} in items, in {files} file{'s' * (files != 1)} "
                f"of {_size(on_disk)}"
            )
        if self.receipt is not None:
            r = self.receipt
            state = "does not match" if r.problems else "matches"
            lines.append(
                f"receipt: {r.kind} {r.receipt_sha256[:12] or '?'} {state} "
                f"({r.files} files, sizes and SHA-256)"
            )
        if self.estimate is not None:
            lines += _estimate_lines(self.estimate)
        lines += [f"problem: {problem}" for problem in self.problems]
        count = len(self.problems)
        lines.append(
            "verdict: sound" if self.sound else f"verdict: {count} problem{'s' * (count != 1)}"
        )
        return lines


def _contents(c: Contents) -> dict[str, Any]:
    return {
        "byte_items": c.byte_items,
        "chunks": c.chunks,
        "files": [{"path": canonical.printable(p), "size": s} for p, s in c.files],
        "keys": c.keys,
        "stored_bytes": c.stored_bytes,
        "tensors": c.tensors,
        "version": c.version,
    }


def _receipt(r: ReceiptCheck) -> dict[str, Any]:
    return {
        "files": r.files,
        "kind": r.kind,
        "label": r.label,
        "matches": not r.problems,
        "sha256": r.receipt_sha256,
    }


def _estimate(e: estimate.Estimate) -> dict[str, Any]:
    largest = None
    if e.largest is not None:
        largest = {
            "dtype": e.largest.dtype,
            "key": e.largest.key,
            "shape": list(e.largest.shape),
            "stored_bytes": e.largest.stored_bytes,
        }
    return {
        "bytes_per_rank": list(e.bytes_per_rank),
        "largest_tensor": largest,
        "note": estimate.NOTE,
        "same_on_every_rank": list(e.same_on_every_rank),
        "world_size": e.world_size,
    }


def _estimate_lines(e: estimate.Estimate) -> list[str]:
    per_rank = e.bytes_per_rank
    lines = [f"at world size {e.world_size}, {estimate.NOTE}:"]
    if len(per_rank) <= 8:
        lines.append("  bytes per rank: " + ", ".join(_size(b) for b in per_rank))
    else:
        lines.append(f"  bytes per rank: {_size(min(per_rank))} to {_size(max(per_rank))}")
    if e.largest is not None:
        lines.append(
            f"  largest tensor: {e.largest.key} {tiling.shown(e.largest.shape)} "
            f"{e.largest.dtype}, {_size(e.largest.stored_bytes)}"
        )
    keys = e.same_on_every_rank
    if keys:
        shown = ", ".join(keys[:_SHOWN_KEYS]) + (", ..." if len(keys) > _SHOWN_KEYS else "")
        lines.append(f"  same on every rank: {len(keys)} keys ({canonical.shown(shown)})")
    return lines


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.1f} {unit}"
    return f"{n} B"
