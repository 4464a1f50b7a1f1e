"""Per-key state records for a user's fixture: flattened paths, type, digest, and snapshots.

A resume that diverges is only useful to a user when it names the key: ``app.optimizer.state.
fc.weight.momentum_buffer``, not "component 'optimizer'". Every leaf of ``{"app": app}``'s state
dict is recorded as ``"<dtype>[<shape>] <sha256>"`` (or ``"<type> <sha256>"`` for a Python
value), so the verifier can say which keys differ without torch. Snapshots keep the values
themselves inside the scenario's workspace, so a later group can say by how much.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from dcp_invariant.suite.digest import value_digest

# Bounds what one phase of one rank may add to an observation.
MAX_KEYS = 20_000
MAX_DIFFS_PER_PHASE = 32


class StateKeyError(ValueError):
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


def save_snapshot(leaves: Mapping[str, Any], path: Path) -> None:
    torch.save(
        {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in leaves.items()}, path
    )


def load_snapshot(path: Path) -> dict[str, Any]:
    # Written by this run's own worker into the scenario workspace, never by anyone else.
    loaded: dict[str, Any] = torch.load(path, weights_only=False)
    return loaded


def differences(
    expected: Mapping[str, Any], got: Mapping[str, Any], phase: str
) -> list[dict[str, Any]]:
    """The keys whose values differ, with the largest absolute difference of float tensors."""
    out: list[dict[str, Any]] = []
    for key in sorted(set(expected) | set(got)):
        if len(out) >= MAX_DIFFS_PER_PHASE:
            break
        if key not in expected or key not in got:
            continue
        a, b = expected[key], got[key]
        if value_digest(a) == value_digest(b):
            continue
        out.append({"key": key, "max_abs_diff": _max_abs_diff(a, b), "phase": phase})
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
