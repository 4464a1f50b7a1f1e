"""Real ``torch.distributed.checkpoint.save`` checkpoints for the inspect tests and test data.

``python tests/inspection/dcp_writer.py OUT --world-size W`` writes one checkpoint into ``OUT``
(which must not exist) from W processes under Gloo on loopback. Each rank is its own
interpreter started with a timeout and reaped (:func:`write_checkpoint`); rendezvous goes
through a ``FileStore``, so no port is ever chosen.

The state holds what DCP writes into ``.metadata``: plain tensors of several dtypes (a 0-d and
an empty one among them), non-tensor values (ints, a string, a nested dict: DCP flattens them
into byte items), and an FSDP2 model with its Adam state (``fully_shard`` over
``init_device_mesh("cpu", (W,))``: DTensors sharded along dim 0, unevenly where the rows do
not divide by W, and the optimizer's replicated ``step`` tensors).

``--mib N`` adds an FSDP2 parameter of about N MiB (for the size measurement).

``python tests/inspection/dcp_writer.py --test-data`` regenerates tests/data/metadata/: the
``.metadata`` of a save at world sizes 1, 2 and 4, each written as ``checkpoint`` relative to a
temporary directory, so the pickle's ``checkpoint_id`` names no path of this machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NoReturn

# Seconds one whole save may take at any world size, startup included (a save here takes ~5 s).
TIMEOUT = 300.0
TEST_DATA = Path(__file__).resolve().parents[1] / "data" / "metadata"
TEST_DATA_WORLD_SIZES = (1, 2, 4)


def data_file_name(world_size: int) -> str:
    return f"torch-2.13.0-ws{world_size}.metadata"


def regenerate_test_data(target: Path = TEST_DATA) -> list[Path]:
    """Write the checked-in ``.metadata`` files anew into ``target``."""
    target.mkdir(parents=True, exist_ok=True)
    written = []
    for world_size in TEST_DATA_WORLD_SIZES:
        with tempfile.TemporaryDirectory(prefix="dcp-writer-data-") as work:
            write_checkpoint(Path("checkpoint"), world_size, cwd=Path(work))
            path = target / data_file_name(world_size)
            shutil.copyfile(Path(work) / "checkpoint" / ".metadata", path)
            written.append(path)
    return written


def write_checkpoint(
    out: Path,
    world_size: int,
    *,
    mib: int = 0,
    timeout: float = TIMEOUT,
    tiny: bool = False,
    cwd: Path | None = None,
) -> None:
    """Run ``world_size`` ranks that save one checkpoint into ``out`` (relative to ``cwd``);
    raise if any fails."""
    with tempfile.TemporaryDirectory(prefix="dcp-writer-") as work:
        store = Path(work) / "store"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": work}
        loopback = _loopback()
        if loopback is not None:
            env["GLOO_SOCKET_IFNAME"] = loopback
        command = [sys.executable, __file__, str(out), "--world-size", str(world_size)]
        command += ["--mib", str(mib), "--store", str(store)]
        command += ["--tiny"] if tiny else []
        logs = [Path(work) / f"rank{rank}.log" for rank in range(world_size)]
        ranks: list[subprocess.Popen[bytes]] = []
        try:
            for rank, log in enumerate(logs):
                with open(log, "wb") as sink:
                    ranks.append(
                        subprocess.Popen(
                            [*command, "--rank", str(rank)],
                            stdout=sink,
                            stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL,
                            env=env,
                            cwd=cwd,
                        )
                    )
            deadline = time.monotonic() + timeout
            codes = [p.wait(timeout=max(0.1, deadline - time.monotonic())) for p in ranks]
        finally:
            for p in ranks:  # a timeout or a failed start: nothing is left running
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=30)
        if any(codes):
            tail = "\n".join(log.read_text(errors="replace")[-3000:] for log in logs)
            raise RuntimeError(f"dcp.save at world size {world_size} failed {codes}:\n{tail}")


def _loopback() -> str | None:
    import socket

    names = [name for _, name in socket.if_nameindex()] if hasattr(socket, "if_nameindex") else []
    return next((n for n in names if n in ("lo", "lo0")), None)


def _rank_main(
    out: Path, rank: int, world_size: int, store: Path, mib: int, tiny: bool
) -> NoReturn:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(str(store), world_size),
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=TIMEOUT),
    )
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        # 10 rows split unevenly at 4 ranks (3, 3, 3, 1); 3 rows leave rank 3 an empty shard.
        layers = [torch.nn.Linear(8, 10), torch.nn.ReLU(), torch.nn.Linear(10, 3)]
        if mib:
            rows = max(world_size, (mib << 20) // (4 * 1024))
            layers.append(torch.nn.Linear(3, 1024, bias=False))
            layers[-1].weight = torch.nn.Parameter(torch.randn(rows, 1024))
        model = torch.nn.Sequential(*layers)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optim = torch.optim.Adam(model.parameters(), lr=0.1)
        if not mib:
            model(torch.randn(4, 8)).sum().backward()  # Adam's state exists after a step
            optim.step()
        model_sd, optim_sd = get_state_dict(model, optim)
        state: dict[str, object] = {"model": model_sd}
        if not tiny:
            state["optim"] = optim_sd
            state["plain"] = {
                "f32": torch.arange(12, dtype=torch.float32).reshape(3, 4),
                "f64": torch.arange(5, dtype=torch.float64),
                "bf16": torch.ones(2, 3, dtype=torch.bfloat16),
                "f16": torch.ones(4, dtype=torch.float16),
                "i64": torch.arange(6, dtype=torch.int64).reshape(2, 3),
                "i32": torch.arange(3, dtype=torch.int32),
                "u8": torch.zeros(7, dtype=torch.uint8),
                "bool": torch.tensor([True, False]),
                "scalar": torch.tensor(7),
                "empty": torch.zeros(0, 4),
            }
            state["extra"] = {"step": 3, "name": "run-1", "nested": {"a": 1, "b": [1, 2]}}
        dcp.save(state, checkpoint_id=str(out))
        dist.barrier()
    except BaseException:
        dist.destroy_process_group()
        raise
    # Every rank is past the save, whose files are complete once it returns on every rank: the
    # rank leaves without tearing Gloo down. A rank that destroys its group while a peer's Gloo
    # threads still talk to it aborts that peer ("terminate called without an active
    # exception", exit -6), which a barrier before the teardown made rarer but did not end: it
    # recurred under load in a live run beside a busy loop. The runner's workers leave the same
    # way (dcp_invariant.suite.worker.exit_without_teardown).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path, nargs="?")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--test-data", action="store_true", help="regenerate tests/data/metadata/")
    parser.add_argument("--mib", type=int, default=0)
    parser.add_argument("--tiny", action="store_true", help="the model alone (small test data)")
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--store", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None and args.store is not None:
        _rank_main(args.out, args.rank, args.world_size, args.store, args.mib, args.tiny)
    if args.test_data:
        for path in regenerate_test_data():
            print(path)
        return 0
    if args.out is None or args.out.exists():
        parser.error("name a new directory to write, or --test-data")
    write_checkpoint(args.out, args.world_size, mib=args.mib, tiny=args.tiny)
    return 0


if __name__ == "__main__":
    sys.exit(main())
