"""State digests: one SHA-256 per top-level component of an app's state dict, plus an aggregate.

Tensors are hashed as (dtype, shape, raw bytes) so two states digest equal exactly when they
are bit-identical; Python scalars are hashed by type and exact value (floats as ``float.hex``).
Only workers import this module (it needs torch); the verifier compares the hex strings.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from dcp_invariant import canonical

AGGREGATE = "aggregate"


def component_digests(state: Mapping[str, Any]) -> dict[str, str]:
    """Digest each top-level component and add ``aggregate`` over the sorted component digests."""
    if AGGREGATE in state:
        raise ValueError(f"a state component may not be named {AGGREGATE!r}: the name is reserved")
    out = {name: value_digest(value) for name, value in state.items()}
    out[AGGREGATE] = canonical.digest(sorted(out.items()))
    return out


# Digests of plain tensors taken inside :func:`remembering`, by where their bytes are, each with
# its tensor: held, its memory cannot be freed and reused by another tensor at the same address
# (a generator's get_state() makes a new one each time) before the phase ends.
_remembered: dict[tuple[Any, ...], tuple[str, torch.Tensor]] | None = None


@contextlib.contextmanager
def remembering() -> Iterator[None]:
    """Within, a tensor whose bytes were hashed already is not hashed again.

    One phase of a rank records the state dict's leaves and then walks the app's objects,
    whose parameters and optimizer state are the same memory: at 1 GiB, hashing it twice is
    most of the phase. Only a phase: nothing runs between its two records, whereas across
    steps a tensor changed through ``.data`` keeps its version counter, so an address and a
    version would not prove its bytes the same.
    """
    global _remembered
    outer = _remembered
    _remembered = {} if outer is None else outer
    try:
        yield
    finally:
        _remembered = outer


def value_digest(value: Any) -> str:
    memory = _remembered
    where = _where(value) if memory is not None else None
    if memory is not None and where is not None and where in memory:
        return memory[where][0]
    h = hashlib.sha256()
    _feed(h, value)
    digest = h.hexdigest()
    if memory is not None and where is not None:
        memory[where] = (digest, value)
    return digest


def _where(value: Any) -> tuple[Any, ...] | None:
    """Where a plain tensor's bytes are (storage, offset, shape, strides, dtype, device); None
    for anything else (a DTensor's global value is gathered anew, a quantized one has a scale
    beside its bytes)."""
    if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.is_quantized:
        return None
    if value.layout != torch.strided or value.is_meta or value.is_nested:
        return None
    return (
        value.untyped_storage().data_ptr(),
        value.storage_offset(),
        tuple(value.shape),
        value.stride(),
        value.dtype,
        value.device,
        value.is_conj(),  # the same memory read conjugated or negated is another value
        value.is_neg(),
    )


def _feed(h: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        tensor = value.detach()
        if hasattr(tensor, "full_tensor") and hasattr(tensor, "placements"):
            # A DTensor digests as its global value, so shards at any world size compare equal.
            tensor = tensor.full_tensor()
        tensor = tensor.cpu().resolve_conj().resolve_neg().contiguous()
        header = f"tensor:{tensor.dtype}:{list(tensor.shape)}:"
        if tensor.is_quantized:
            # DCP saves a quantized tensor's integers only and loads them into the destination,
            # which keeps its own scale (torch/distributed/checkpoint/filesystem.py, read_data:
            # target_tensor.copy_): the scale is part of the value, so it is hashed too.
            header += _quantization(tensor)
            tensor = tensor.int_repr()
        h.update(header.encode())
        # The tensor's own bytes, not a copy: hashlib reads any C-contiguous buffer, and at
        # 1 GiB a copy (``.numpy().tobytes()``) costs more than the hash.
        h.update(tensor.view(-1).view(torch.uint8).numpy())
    elif isinstance(value, Mapping):
        h.update(f"map:{len(value)}:".encode())
        for key in sorted(value, key=repr):
            h.update(f"{key!r}=".encode())
            _feed(h, value[key])
    elif isinstance(value, (list, tuple)):
        h.update(f"{type(value).__name__}:{len(value)}:".encode())
        for item in value:
            _feed(h, item)
    elif isinstance(value, bool) or value is None:
        h.update(f"{value!r};".encode())
    elif isinstance(value, int):
        h.update(f"int:{value};".encode())
    elif isinstance(value, float):
        h.update(f"float:{value.hex()};".encode())
    elif isinstance(value, str):
        h.update(f"str:{len(value)}:{value};".encode())
    elif isinstance(value, bytes):
        h.update(f"bytes:{len(value)}:".encode() + value)
    else:
        raise TypeError(
            f"a {type(value).__name__}, which DCP cannot be checked on: use tensors, numbers, "
            "strings, bytes, lists or dicts"
        )


def _quantization(tensor: torch.Tensor) -> str:
    scheme = tensor.qscheme()
    if scheme in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        return f"q:{scheme}:{float(tensor.q_scale()).hex()}:{int(tensor.q_zero_point())}:"
    scales = tensor.q_per_channel_scales().double().tolist()
    points = tensor.q_per_channel_zero_points().tolist()
    return (
        f"q:{scheme}:{tensor.q_per_channel_axis()}:"
        f"{[float(x).hex() for x in scales]}:{[int(x) for x in points]}:"
    )
