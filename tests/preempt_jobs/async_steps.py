"""A single-process job that checkpoints with DCP's ``async_save`` into ``step-N`` folders and
names the newest in a ``latest`` file, as jobs that overlap saving with training do:
``python async_steps.py RUN_DIR --latest {when_done,at_once}``.

``async_save`` stages the state and returns a future while a background thread writes the
files (torch/distributed/checkpoint/state_dict_saver.py); the job waits for the previous
future before its next save and at the end, as torchtitan's CheckpointManager does.
``when_done`` writes ``latest`` (to a temporary file, then ``os.replace``) once the future is
done; ``at_once`` writes it right after ``async_save`` returns, so a kill while the thread
still writes leaves ``latest`` naming a folder without ``.metadata``, and every relaunch
fails to load it.
"""

from __future__ import annotations

import argparse
import os
import warnings
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # one process
parser = argparse.ArgumentParser()
parser.add_argument("run_dir")
parser.add_argument("--latest", choices=["when_done", "at_once"], required=True)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--every", type=int, default=2)
args = parser.parse_args()
torch.set_num_threads(1)

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.Generator().manual_seed(1)
pointer = os.path.join(args.run_dir, "latest")


def state() -> dict[str, Any]:
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "data": data.get_state(),
    }


def name_latest(step: int) -> None:
    with open(pointer + ".tmp", "w") as file:
        file.write(str(step))
    os.replace(pointer + ".tmp", pointer)


start = 0
if os.path.exists(pointer):
    with open(pointer) as file:
        start = int(file.read())
    loaded = state()
    dcp.load(loaded, checkpoint_id=os.path.join(args.run_dir, f"step-{start}"))
    model.load_state_dict(loaded["model"])
    optimizer.load_state_dict(loaded["optimizer"])
    data.set_state(loaded["data"])

pending: tuple[int, Future[Any]] | None = None
for step in range(start + 1, args.steps + 1):
    x = torch.randn(8, 4, generator=data)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item().hex()}", flush=True)
    if step % args.every == 0:
        if pending is not None:
            pending[1].result()
            if args.latest == "when_done":
                name_latest(pending[0])
        future = dcp.async_save(state(), checkpoint_id=os.path.join(args.run_dir, f"step-{step}"))
        pending = (step, future)
        if args.latest == "at_once":
            name_latest(step)
if pending is not None:
    pending[1].result()
    if args.latest == "when_done":
        name_latest(pending[0])
torch.save(model.state_dict(), os.path.join(args.run_dir, "final.pt"))
