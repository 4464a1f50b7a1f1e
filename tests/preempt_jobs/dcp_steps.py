"""A two-rank torchrun job that saves with DCP into ``step-N`` folders, keeps the newest two,
and at start resumes from the newest: ``torchrun ... dcp_steps.py RUN_DIR [--check-metadata]``.

Without ``--check-metadata`` its discovery takes the newest ``step-N`` whatever it holds, the
bug of torchtitan PR #4191: a kill mid-save leaves ``step-N`` without ``.metadata`` (DCP writes
it last, torch/distributed/checkpoint/filesystem.py), and every relaunch then fails to load it.
With it, the discovery skips such a folder, as torchtitan's ``_find_load_step`` does.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

parser = argparse.ArgumentParser()
parser.add_argument("run_dir")
parser.add_argument("--check-metadata", action="store_true")
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--every", type=int, default=2)
args = parser.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()

torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.Generator().manual_seed(1)


def state() -> dict[str, Any]:
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "data": data.get_state(),
    }


def newest() -> int:
    found = []
    for name in os.listdir(args.run_dir):
        match = re.fullmatch(r"step-(\d+)", name)
        if match is None:
            continue
        if args.check_metadata and not os.path.exists(
            os.path.join(args.run_dir, name, ".metadata")
        ):
            continue
        found.append(int(match.group(1)))
    return max(found, default=0)


start = newest()
if start:
    loaded = state()
    dcp.load(loaded, checkpoint_id=os.path.join(args.run_dir, f"step-{start}"))
    model.load_state_dict(loaded["model"])
    optimizer.load_state_dict(loaded["optimizer"])
    data.set_state(loaded["data"])

for step in range(start + 1, args.steps + 1):
    x = torch.randn(8, 4, generator=data)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    optimizer.step()
    if rank == 0:
        print(f"step {step} loss {loss.item().hex()}", flush=True)
    if step % args.every == 0:
        dcp.save(state(), checkpoint_id=os.path.join(args.run_dir, f"step-{step}"))
        dist.barrier()
        if rank == 0:  # keep the newest two
            for old in range(step - 3 * args.every, step - args.every, args.every):
                shutil.rmtree(os.path.join(args.run_dir, f"step-{old}"), ignore_errors=True)
dcp.save(state(), checkpoint_id=os.path.join(args.run_dir, "final"))
dist.destroy_process_group()
