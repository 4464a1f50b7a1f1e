"""How long ``dcp-invariant inspect`` takes on the checkpoints docs/inspect.md names: a benchmark,
not a test (the figures depend on the machine).

    python tests/inspection/benchmark_inspect.py bomb OUT
        the memo bomb: one chunk of 100,000 dimensions named 30,000 times (262 KB), torch-free
    python tests/inspection/benchmark_inspect.py chunks OUT [--tensors 1000] [--world-size 1000]
        a checkpoint of TENSORS (8000, 1024) float32 parameters saved by WORLD_SIZE FSDP2 ranks:
        TENSORS * WORLD_SIZE chunks. Needs torch: its .metadata is what DCP's own global planner
        (``create_default_global_save_plan``) and ``FileSystemWriter.finish`` write from the
        ranks' plans, each carried through pickle as ``gather_object`` carries it; built in one
        process. Each shard is a sparse file of its size (inspect reads sizes only).
    python tests/inspection/benchmark_inspect.py time DIR [DIR ...] [--repeat 3]
        ``python -m dcp_invariant inspect DIR`` in a fresh interpreter: the best wall and CPU
        seconds of REPEAT runs, its exit code and its peak memory. Set PYTHONPATH to time
        another copy of the package.

The 1 GiB checkpoint at world size 4: ``python tests/inspection/dcp_writer.py OUT --world-size 4
--mib 1024``, then ``time OUT``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from metadata_pickler import memo_bomb

TIMEOUT = 3600.0


def write_bomb(out: Path) -> None:
    out.mkdir(parents=True)
    (out / ".metadata").write_bytes(memo_bomb(100_000, 30_000))


def write_chunks(out: Path, tensors: int, world_size: int, rows: int, cols: int) -> None:
    import torch
    from torch.distributed.checkpoint.default_planner import create_default_global_save_plan
    from torch.distributed.checkpoint.filesystem import FileSystemWriter, _StorageInfo
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        MetadataIndex,
        TensorProperties,
    )
    from torch.distributed.checkpoint.planner import (
        SavePlan,
        TensorWriteData,
        WriteItem,
        WriteItemType,
    )
    from torch.distributed.checkpoint.storage import WriteResult

    out.mkdir(parents=True)
    per = -(-rows // world_size)  # torch.chunk along dim 0, as fully_shard splits a parameter
    plans = []
    for rank in range(world_size):
        low, high = min(rows, rank * per), min(rows, (rank + 1) * per)
        items = []
        for t in range(tensors):
            offsets, sizes = torch.Size((low, 0)), torch.Size((high - low, cols))
            # planner_helpers.py _create_write_items_for_dtensor
            items.append(
                WriteItem(
                    index=MetadataIndex(f"model.layers.{t}.weight", offsets),
                    type=WriteItemType.SHARD,
                    tensor_data=TensorWriteData(
                        chunk=ChunkStorageMetadata(offsets=offsets, sizes=sizes),
                        properties=TensorProperties(dtype=torch.float32),
                        size=torch.Size((rows, cols)),
                    ),
                )
            )
        plans.append(pickle.loads(pickle.dumps(SavePlan(items))))
    global_plans, metadata = create_default_global_save_plan(plans)
    results: list[Any] = []
    for rank, plan in enumerate(global_plans):
        name, at, written = f"__{rank}_0.distcp", 0, []
        for item in plan.items:
            length = 4 * item.tensor_data.chunk.sizes.numel()
            info = _StorageInfo(name, at, length)
            written.append(WriteResult(index=item.index, size_in_bytes=length, storage_data=info))
            at += length
        results.append(pickle.loads(pickle.dumps(written)))
        with open(out / name, "wb") as f:
            f.truncate(at)
    FileSystemWriter(str(out)).finish(metadata, results)


def _children() -> tuple[float, int]:
    """CPU seconds and peak RSS (KiB) of the finished children; Windows has no ``resource``."""
    if sys.platform == "win32":
        return 0.0, 0
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime, usage.ru_maxrss


def time_inspect(directory: Path, repeat: int) -> str:
    runs = []
    for _ in range(repeat):
        cpu_before, _ = _children()
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "dcp_invariant", "inspect", str(directory)],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        wall = time.perf_counter() - started
        cpu_after, rss = _children()
        verdict = (done.stdout.splitlines() or ["(no output)"])[-1]
        runs.append((wall, cpu_after - cpu_before, done.returncode, verdict, rss))
    wall, cpu, code, verdict, rss = min(runs)
    size = (directory / ".metadata").stat().st_size
    return (
        f"{directory}: .metadata {size} bytes; best of {repeat}: {wall:.2f} s wall, "
        f"{cpu:.2f} s CPU; exit {code} ({verdict}); peak RSS {rss >> 10} MiB"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    bomb = sub.add_parser("bomb")
    bomb.add_argument("out", type=Path)
    chunks = sub.add_parser("chunks")
    chunks.add_argument("out", type=Path)
    chunks.add_argument("--tensors", type=int, default=1000)
    chunks.add_argument("--world-size", type=int, default=1000)
    chunks.add_argument("--rows", type=int, default=8000)
    chunks.add_argument("--cols", type=int, default=1024)
    timed = sub.add_parser("time")
    timed.add_argument("directories", type=Path, nargs="+")
    timed.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    if args.command == "bomb":
        write_bomb(args.out)
    elif args.command == "chunks":
        write_chunks(args.out, args.tensors, args.world_size, args.rows, args.cols)
    else:
        print(f"PYTHONPATH={os.environ.get('PYTHONPATH', '')}")
        for directory in args.directories:
            print(time_inspect(directory, args.repeat), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
