"""A dcp-invariant generation, or a sealed candidate, checked against its receipt.

The commit protocol (:mod:`dcp_invariant.commit.store`) keeps each checkpoint's receipt beside
its directory: ``generations/<receipt sha256>/`` with ``generations/<sha256>.receipt.json``, and
``candidates/<label>/`` with ``candidates/<label>.receipt.json`` once sealed. A receipt lists
every file's size and SHA-256, which DCP itself never records; checking it is the one step of
``inspect`` that reads every byte of every file.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from dcp_invariant import canonical, regular_file
from dcp_invariant.commit import durable, receipt
from dcp_invariant.commit.errors import ReceiptError
from dcp_invariant.commit.store import RECEIPT_SUFFIX
from dcp_invariant.inspection.problems import Problem
from dcp_invariant.plan import FailureReason

Kind = Literal["generation", "candidate"]
_SAYS: Final[dict[FailureReason, str]] = {
    "missing": "listed by the receipt, missing",
    "size": "its size differs from the receipt's",
    "digest": "its SHA-256 differs from the receipt's",
    "unexpected": "not listed by the receipt",
    "not a regular file": "not a regular file",
}


@dataclass(frozen=True)
class ReceiptCheck:
    kind: Kind
    label: str  # the receipt's label; "" when the receipt could not be read
    receipt_sha256: str
    files: int  # files the receipt lists
    problems: tuple[Problem, ...]


def receipt_path(directory: Path) -> tuple[Kind, Path] | None:
    """Where the receipt of ``directory`` lies, if the commit protocol wrote one for it."""
    absolute = Path(os.path.abspath(directory))
    beside = absolute.parent / f"{absolute.name}{RECEIPT_SUFFIX}"
    if not os.path.lexists(beside):
        return None
    if canonical.HEX64.fullmatch(absolute.name):
        return "generation", beside
    if absolute.parent.name == "candidates":
        return "candidate", beside
    return None


def check(directory: Path) -> ReceiptCheck | None:
    """``None`` for a directory the commit protocol did not write; else every mismatch."""
    found = receipt_path(directory)
    if found is None:
        return None
    kind, path = found
    shown = path.name
    try:
        raw = regular_file.read(path, bound=durable.MAX_RECORD_BYTES)
    except (OSError, ValueError) as exc:
        problem = Problem("receipt", f"{shown} cannot be read: {exc}")
        return ReceiptCheck(kind, "", "", 0, (problem,))
    digest = hashlib.sha256(raw).hexdigest()
    try:
        sealed = receipt.Receipt.decode(raw)
    except ReceiptError as exc:
        return ReceiptCheck(kind, "", digest, 0, (Problem("receipt", f"{shown}: {exc}"),))
    problems = []
    if kind == "generation" and digest != Path(os.path.abspath(directory)).name:
        problems.append(
            Problem(
                "receipt mismatch",
                f"{shown}: its SHA-256 is {digest[:12]}, not the generation's name",
            )
        )
    for failure in receipt.check(directory, sealed):
        problems.append(Problem("receipt mismatch", f"{failure.path}: {_SAYS[failure.reason]}"))
    return ReceiptCheck(kind, sealed.label, digest, len(sealed.files), tuple(problems))
