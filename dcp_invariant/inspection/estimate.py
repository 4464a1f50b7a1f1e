"""What each rank would read when the checkpoint is loaded at another world size: an estimate.

DCP's load planner reads, for each rank, the stored chunks that overlap what that rank's state
dict asks for (torch/distributed/checkpoint/default_planner.py). Without the loader's state
dict, this assumes what an FSDP2 loader asks for: a tensor saved in several chunks (a DTensor
or ShardedTensor) is split along dim 0 as ``fully_shard`` splits it (``torch.chunk``: ranks take
ceil(rows / W) rows each, the last ones fewer or none), and every other key -- a tensor saved
as one chunk covering it, or a byte item -- is read whole by every rank. Bytes are the stored
lengths, so a rank reading part of a chunk is counted its share of the chunk's bytes.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from dcp_invariant.inspection import records
from dcp_invariant.inspection.budget import Budget

NOTE = (
    "an estimate: sharded tensors split along dim 0 as FSDP2 does, every other key read whole "
    "by every rank; the real plan depends on the loader's state dict"
)


@dataclass(frozen=True)
class Largest:
    key: str
    shape: records.Shape
    dtype: str
    stored_bytes: int


@dataclass(frozen=True)
class Estimate:
    world_size: int
    bytes_per_rank: tuple[int, ...]
    largest: Largest | None  # the tensor with the most stored bytes; None without tensors
    same_on_every_rank: tuple[str, ...]  # keys every rank reads whole


def estimate(metadata: records.Metadata, world_size: int, budget: Budget | None = None) -> Estimate:
    """The estimate at ``world_size``; each sharded tensor's share of each rank that gets rows
    of it is work spent from ``budget`` (a key read whole costs one addition)."""
    budget = Budget() if budget is None else budget
    stored = _stored_bytes(metadata)
    per_rank = [0] * world_size
    everyone = 0  # bytes every rank reads
    whole: list[str] = []
    largest: Largest | None = None
    for key, item in metadata.state_dict_metadata.items():
        size = stored.get(key, 0)
        if isinstance(item, records.TensorStorageMetadata):
            if largest is None or size > largest.stored_bytes:
                largest = Largest(key, item.size, item.properties.dtype.name, size)
            if is_sharded(item):
                ranks = min(item.size[0], world_size)  # the ranks that get rows of it
                budget.spend(ranks, f"{key}: its share of each of {ranks} ranks")
                for rank, share in enumerate(_row_shares(size, item.size[0], world_size)):
                    per_rank[rank] += share
                continue
        whole.append(key)
        everyone += size
    return Estimate(
        world_size, tuple(total + everyone for total in per_rank), largest, tuple(whole)
    )


def is_sharded(item: records.TensorStorageMetadata) -> bool:
    """Saved in more than one non-empty chunk, or one that does not cover the tensor: what a
    DTensor or ShardedTensor saved by several ranks looks like. At world size 1 every tensor is
    one whole chunk, so none is."""
    covering = [c for c in item.chunks if all(c.sizes)]
    if not item.size or item.size[0] == 0:
        return False
    return len(covering) > 1 or any(c.sizes != item.size for c in covering)


def _row_shares(size: int, rows: int, world_size: int) -> list[int]:
    """``size`` bytes split as torch.chunk(rows, world_size) splits rows: by cumulative row, so
    the shares add up to ``size`` exactly. Only the ranks that get rows are listed (at most
    ``rows`` of them): the others get nothing."""
    per = -(-rows // world_size)
    bounds = [rank * per for rank in range(-(-rows // per))] + [rows]
    return [size * b // rows - size * a // rows for a, b in itertools.pairwise(bounds)]


def _stored_bytes(metadata: records.Metadata) -> Mapping[str, int]:
    totals: dict[str, int] = {}
    rows = records.StorageData.of(metadata.storage_data or {})
    for fqn, length in zip(rows.fqns(), rows.lengths(), strict=True):
        totals[fqn] = totals.get(fqn, 0) + max(0, length)
    return totals
