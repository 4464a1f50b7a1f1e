"""Per-key state records for a user's fixture: flattened paths, type, digest, and snapshots.

A resume that diverges is only useful to a user when it names the key: ``app.optimizer.state.
fc.weight.momentum_buffer``, not "component 'optimizer'". Every leaf of ``{"app": app}``'s state
dict is recorded as ``"<dtype>[<shape>] <sha256>"`` (or ``"<type> <sha256>"`` for a Python
value), so the verifier can say which keys differ without torch. Snapshots keep the records and
the floating-point values inside the scenario's workspace, so a later group can say by how much.

Cost follows what must be compared: each leaf is hashed once per phase, from its own memory; a
snapshot is the tensors' raw bytes, written without a copy; a comparison compares the records
and reads back only the values of keys whose digests differ.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dcp_invariant.errors import Error
from dcp_invariant.ranks.digest import value_digest

# Bounds what one phase of one rank may add to an observation.
MAX_KEYS = 20_000
MAX_DIFFS_PER_PHASE = 32


class StateKeyError(Error, ValueError):
    """A state dict this tool cannot record key by key; the message says what to change."""


def flatten(value: Any, prefix: str = "app") -> dict[str, Any]:
    """Leaves by dotted path, in sorted order; empty containers are leaves of their own."""
    out: dict[str, Any] = {}
    _flatten(value, prefix, out)
    return out


def _flatten(value: Any, path: str, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping) and not isinstance(value, torch.Tensor):
        if not value:
            out[path] = value
        for key in sorted(value, key=str):
            _flatten(value[key], f"{path}.{key}", out)
    elif isinstance(value, (list, tuple)):
        if not value:
            out[path] = value
        for i, item in enumerate(value):
            _flatten(item, f"{path}.{i}", out)
    else:
        out[path] = value
    if len(out) > MAX_KEYS:
        raise StateKeyError(f"the state dict has more than {MAX_KEYS} leaves")


def full(value: Any) -> Any:
    """A DTensor's global value (a collective: every rank calls it in the same order)."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        if hasattr(tensor, "full_tensor") and hasattr(tensor, "placements"):
            tensor = tensor.full_tensor()
        return tensor.cpu()
    return value


def describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{dtype}[{','.join(str(d) for d in value.shape)}]"
    if isinstance(value, Mapping):
        return "map[0]"
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__}[0]"
    return type(value).__name__


def record(leaves: Mapping[str, Any]) -> dict[str, str]:
    """``{path: "<type> <sha256>"}`` for already-gathered leaves."""
    return {path: f"{describe(v)} {value_digest(v)}" for path, v in leaves.items()}


def gather(state: Mapping[str, Any]) -> dict[str, Any]:
    """Flatten ``state`` and replace every DTensor by its global value, on every rank alike."""
    return {path: full(v) for path, v in flatten(state).items()}


def refusal(state: Mapping[str, Any]) -> str | None:
    """What in ``state`` DCP cannot save, by key, with the fix; None when there is nothing.

    Looks at types, layouts and devices only (no data is read, no collective runs). Measured
    with torch 2.13 at world size 1: ``dcp.save`` fails on a sparse COO or CSR tensor ("Cannot
    access storage of SparseTensorImpl": the writer reads ``untyped_storage()``, torch/
    distributed/checkpoint/filesystem.py), on a meta tensor ("Cannot copy out of meta tensor")
    and on a nested tensor, strided or jagged (its planner needs one size per dimension); it
    saves an expanded tensor but cannot load into one. It saves and loads quantized,
    non-contiguous, complex, bool and float8 tensors.
    """
    for path, value in flatten(state).items():
        if not isinstance(value, torch.Tensor):
            continue
        tensor = value.detach()
        if hasattr(tensor, "to_local") and hasattr(tensor, "placements"):
            tensor = tensor.to_local()  # a DTensor: what this rank holds
        problem = _unsavable(tensor)
        if problem is not None:
            return f"{path}, {problem}"
    return None


def _unsavable(tensor: torch.Tensor) -> str | None:
    where = f"layout {tensor.layout}, device {tensor.device}"
    if tensor.is_nested:
        return (
            f"a nested tensor ({where}), which DCP cannot save: its planner needs one size per "
            "dimension; save its components (tensor.unbind()) or its values() and offsets() "
            "instead, and rebuild it in load_state_dict()"
        )
    if tensor.layout != torch.strided:
        return (
            f"a sparse tensor ({where}), which DCP cannot save: its writer reads a tensor's "
            "storage, and a sparse tensor has none; save tensor.to_dense() (or its indices() "
            "and values()) instead, and rebuild it in load_state_dict()"
        )
    if torch._debug_has_internal_overlap(tensor) == 1:
        # MemOverlap::Yes (aten/src/ATen/MemoryOverlap.h): elements share memory, as in an
        # expand(). DCP saves it, but loads by copying into the app's own tensor, which torch
        # refuses for such a tensor (filesystem.py, read_data: target_tensor.copy_).
        return (
            f"an expanded tensor ({where}, strides {list(tensor.stride())}), which DCP saves "
            "but cannot load into: its elements share memory; return tensor.clone() (or the "
            "tensor it expands) in state_dict()"
        )
    if tensor.device.type == "meta":
        return (
            f"a tensor on the meta device ({where}), which DCP cannot save: it holds no data; "
            "materialise it (e.g. module.to_empty(device='cpu'), then initialise it) before "
            "the app is returned, or leave it out of state_dict()"
        )
    return None


@dataclass(frozen=True)
class Snapshot:
    """One phase of one rank as a later group reads it: the records, and a way to the values."""

    keys: dict[str, str]
    tensors: dict[str, dict[str, Any]]
    data: Path

    def value(self, key: str) -> torch.Tensor | None:
        """The floating-point tensor saved under ``key`` (only those are kept), read on demand."""
        entry = self.tensors.get(key)
        if entry is None:
            return None
        buffer = bytearray(entry["nbytes"])
        with open(self.data, "rb") as f:
            f.seek(entry["offset"])
            f.readinto(buffer)
        dtype = getattr(torch, entry["dtype"])
        raw = torch.frombuffer(buffer, dtype=torch.uint8)
        return raw.view(dtype).reshape(entry["shape"])


def save_snapshot(leaves: Mapping[str, Any], keys: Mapping[str, str], path: Path) -> None:
    """The records, and the raw bytes of every non-empty floating-point tensor.

    Only those values can ever be needed: a maximum absolute difference is reported for
    floating-point tensors alone (:func:`_max_abs_diff`). The bytes go from the tensor's memory
    to the file; a ``torch.save`` of a 1 GiB tensor costs a clone and a CRC-32 besides.
    """
    tensors: dict[str, dict[str, Any]] = {}
    data = path.with_suffix(".bin")
    with open(data, "wb") as f:
        for key, value in leaves.items():
            if not _kept(value):
                continue
            tensor = value.detach().resolve_conj().resolve_neg().contiguous()
            offset = f.tell()
            f.write(tensor.view(-1).view(torch.uint8).numpy())
            tensors[key] = {
                "dtype": str(tensor.dtype).removeprefix("torch."),
                "nbytes": f.tell() - offset,
                "offset": offset,
                "shape": list(tensor.shape),
            }
    # Written last: a snapshot whose records exist is complete.
    path.write_text(json.dumps({"keys": dict(keys), "tensors": tensors}))


def _kept(value: Any) -> bool:
    return (
        isinstance(value, torch.Tensor)
        and value.is_floating_point()
        and not value.is_quantized
        and value.numel() > 0
    )


def load_snapshot(path: Path) -> Snapshot:
    # Written by this run's own worker into the scenario workspace, never by anyone else.
    header = json.loads(path.read_text())
    return Snapshot(keys=header["keys"], tensors=header["tensors"], data=path.with_suffix(".bin"))


def differences(
    expected: Snapshot, keys: Mapping[str, str], got: Mapping[str, Any], phase: str
) -> list[dict[str, Any]]:
    """The keys whose values differ, with the largest absolute difference of float tensors.

    Keys are compared by their records, which differ exactly when the digests do (the record
    is the value's type and its digest, and the digest covers dtype and shape): only a key
    that differs is read back from the snapshot.
    """
    out: list[dict[str, Any]] = []
    for key in sorted(set(expected.keys) | set(keys)):
        if len(out) >= MAX_DIFFS_PER_PHASE:
            break
        if key not in expected.keys or key not in keys:
            continue
        if expected.keys[key] == keys[key]:
            continue
        diff = _max_abs_diff(expected.value(key), got[key])
        out.append({"key": key, "max_abs_diff": diff, "phase": phase})
    return out


def _max_abs_diff(a: Any, b: Any) -> str | None:
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return None
    if a.shape != b.shape or not (a.is_floating_point() and b.is_floating_point()):
        return None
    if a.numel() == 0:
        return None
    diff = float((a.double() - b.double()).abs().max())
    return diff.hex() if math.isfinite(diff) else repr(diff)
