"""``inspect``: whether a DCP checkpoint directory holds everything its ``.metadata`` promises.

Reads ``.metadata`` (bounded, never through pickle: :mod:`.metadata`), lists the directory
once, and checks from sizes and offsets alone: every file an item names, every item's byte
range, every tensor's chunks against its shape, every byte item's entry; a dcp-invariant
generation also against its receipt. No shard is read unless a receipt asks for its SHA-256.
It proves the checkpoint is complete and consistent, not that its values are right.
"""

from __future__ import annotations

import itertools
from pathlib import Path

from dcp_invariant import canonical
from dcp_invariant.dcp_layout import METADATA_FILE
from dcp_invariant.errors import BadWorldSize, NotACheckpoint
from dcp_invariant.inspection import estimate, generation, metadata, records, storage, tiling
from dcp_invariant.inspection.budget import Budget
from dcp_invariant.inspection.errors import MetadataProblem
from dcp_invariant.inspection.problems import Problem
from dcp_invariant.inspection.report import Contents, Inspection

MAX_WORLD_SIZE = 1 << 16
_WROTE = "pass the directory dcp.save wrote (checkpoint_id)"


def inspect_checkpoint(directory: Path, *, world_size: int | None = None) -> Inspection:
    """Check ``directory``; :class:`NotACheckpoint` if it is no DCP checkpoint directory at all."""
    shown = canonical.shown(canonical.printable(str(directory)))
    try:
        entries = storage.listing(directory)
    except FileNotFoundError:
        raise NotACheckpoint(f"{shown} does not exist: {_WROTE}") from None
    except NotADirectoryError:
        raise NotACheckpoint(f"{shown} is not a directory: {_WROTE}") from None
    except (OSError, ValueError) as exc:
        raise NotACheckpoint(f"{shown} cannot be listed ({exc}): {_WROTE}") from None
    meta_entry = entries.get(METADATA_FILE)
    if meta_entry is None:
        raise NotACheckpoint(
            f"{shown} has no {METADATA_FILE}: {_WROTE}; DCP writes it last, so a "
            "save that did not finish has none"
        )
    receipt = generation.check(directory)
    problems = list(receipt.problems) if receipt is not None else []
    report = Inspection(str(directory), None, receipt, None, ())
    if not storage.is_regular(meta_entry):
        problems.insert(0, Problem("not a regular file", f"{METADATA_FILE} is a {meta_entry.kind}"))
        return _with(report, problems)
    try:
        # A large checkpoint's records are millions of objects: read, checked and let go, all
        # with the cyclic collector paused (metadata.collector_paused); back on, it would visit
        # every one still alive (0.3 s for a million chunks).
        with metadata.collector_paused():
            contents, found, planned = _checked(directory, entries, world_size)
    except MetadataProblem as exc:
        problems[0:0] = [Problem(exc.cause, reason) for reason in exc.reasons()]
        return _with(report, problems)
    except OSError as exc:
        problems.insert(0, Problem("unreadable", f"{METADATA_FILE}: {exc}"))
        return _with(report, problems)
    return Inspection(str(directory), contents, receipt, planned, tuple(found + problems))


def _checked(
    directory: Path, entries: dict[str, storage.Entry], world_size: int | None
) -> tuple[Contents, list[Problem], estimate.Estimate | None]:
    """What ``.metadata`` holds, the problems its records show, and the estimate asked for."""
    # One budget for reading .metadata and checking what it holds: both follow the references.
    budget = Budget()
    meta = metadata.read(directory / METADATA_FILE, budget=budget)
    found = storage.check_items(meta)
    if meta.storage_data is not None:
        found += storage.check_files(meta.storage_data, entries)
    found += tiling.check_all(
        (
            (key, item.size, item.chunks)
            for key, item in meta.state_dict_metadata.items()
            if isinstance(item, records.TensorStorageMetadata)
        ),
        budget,
    )
    planned = None if world_size is None else estimate.estimate(meta, world_size, budget)
    return _contents(meta, entries), found, planned


def _with(report: Inspection, problems: list[Problem]) -> Inspection:
    return Inspection(report.directory, None, report.receipt, None, tuple(problems))


def _contents(meta: records.Metadata, entries: dict[str, storage.Entry]) -> Contents:
    items = meta.state_dict_metadata.values()
    tensors = [i for i in items if isinstance(i, records.TensorStorageMetadata)]
    rows = records.StorageData.of(meta.storage_data or {})
    names = sorted(set(rows.paths()))
    sizes = tuple((name, entries[name].size if name in entries else None) for name in names)
    return Contents(
        keys=len(meta.state_dict_metadata),
        tensors=len(tensors),
        byte_items=len(meta.state_dict_metadata) - len(tensors),
        chunks=sum(len(t.chunks) for t in tensors),
        stored_bytes=sum(map(max, itertools.repeat(0), rows.lengths())),
        files=sizes,
        version=meta.version,
    )


def checked_world_size(value: int) -> int:
    """``--world-size``: a positive count of ranks (a bound keeps the estimate's list small)."""
    if not 1 <= value <= MAX_WORLD_SIZE:
        raise BadWorldSize(
            f"--world-size {value}: give a number of ranks from 1 to {MAX_WORLD_SIZE}"
        )
    return value
