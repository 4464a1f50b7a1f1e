"""How torch lays a checkpoint out on disk and a sharded tensor out over ranks: the one home of
these facts for the plan, the evidence, the commit protocol and ``inspect`` (standard library
only)."""

from __future__ import annotations

# DCP's on-disk names (torch/distributed/checkpoint/filesystem.py): FileSystemWriter.finish()
# writes ``.metadata`` last, by rename, so it is DCP's only commit marker; each rank writes
# its data as ``__<rank>_<n>.distcp``.
METADATA_FILE = ".metadata"
SHARD_SUFFIX = ".distcp"
# The files a sealed checkpoint may hold: DCP writes one per rank and .metadata, and an app that
# saves itself (a framework's save_state) what it writes; a receipt and the evidence list each.
MAX_FILES = 4096


def expected_shard_rows(rows: int, world_size: int, rank: int) -> int:
    """Rows of a ``Shard(0)`` DTensor on ``rank``: torch.chunk semantics, ceil-sized, tail short."""
    chunk = -(-rows // world_size)
    return max(0, min(rows, (rank + 1) * chunk) - rank * chunk)


def dcp_files(world_size: int, *, metadata: bool = True) -> list[str]:
    """The files a DCP save at ``world_size`` writes, in the receipt's (byte) order.

    torch's FileSystemWriter (torch/distributed/checkpoint/filesystem.py) names each rank's data
    ``__<rank>_<n>.distcp`` and, writing one file per rank by default
    (``single_file_per_rank=True``, one thread), creates exactly ``__<rank>_0.distcp`` on every
    rank, empty or not; the coordinator's ``finish`` adds ``.metadata`` last.
    """
    shards = [f"__{rank}_0{SHARD_SUFFIX}" for rank in range(world_size)]
    return [METADATA_FILE, *shards] if metadata else shards
