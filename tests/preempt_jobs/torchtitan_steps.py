"""torchtitan 0.3.0's own ``CheckpointManager`` (torchtitan/components/checkpointer/dcp.py, what
torchtitan/components/checkpoint.py re-exports) in a two-rank CPU loop on Gloo, as
``Trainer.train`` drives it: ``torchrun ... torchtitan_steps.py RUN_DIR``.

``Trainer`` itself cannot run on a CPU torch: ``torchtitan.trainer`` imports triton (through
torchtitan/distributed/minimal_async_ep/kernels.py), and without an accelerator
torchtitan/tools/utils.py picks ``"cuda"``, which ``Trainer.__init__`` gives
``device_module.set_device`` (torchtitan/trainer.py). So this loop builds what ``Trainer``
builds: torchtitan's optimizer and LR scheduler containers, its ``ParallelAwareDataloader``
(torchdata's ``StatefulDataLoader``) over a stateful dataset, and the manager with the step as
``train_state``. It loads at start, saves every 2 steps into ``checkpoint/step-N`` keeping the
newest 2 (a purge thread deletes the older ones) and at the last step, and closes the manager.
At a restart ``_find_load_step`` takes the newest ``step-N`` holding ``.metadata``, which DCP
writes last. The model's final state goes to ``RUN_DIR/final`` (DCP).

The last step's save is whole (``last_save_model_only=False``): with torchtitan's default, a
model-only one, every relaunch after it fails to load it (``Missing key in checkpoint
state_dict: dataloader.dp_rank_0``), since a step other than 0 is loaded whole.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.utils.data import IterableDataset
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.dataloader import ParallelAwareDataloader
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw

parser = argparse.ArgumentParser()
parser.add_argument("run_dir")
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--every", type=int, default=2)
args = parser.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()


Pair = tuple[torch.Tensor, torch.Tensor]


class Samples(IterableDataset[Pair]):  # type: ignore[misc]  # torch is Any to mypy
    """This rank's samples, each drawn from its own seed; its state is the next sample's
    number, as torchtitan's HuggingFaceTextDataset keeps ``_sample_idx``."""

    def __init__(self) -> None:
        self.index = 0

    def __iter__(self) -> Iterator[Pair]:
        while True:
            x = torch.randn(4, generator=torch.Generator().manual_seed((rank << 20) | self.index))
            self.index += 1
            yield x, x.sum(0, keepdim=True)

    def state_dict(self) -> dict[str, int]:
        return {"index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.index = state["index"]


class TrainState:
    """What ``Trainer`` gives the manager as ``states={"train_state": self}``."""

    step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = state["step"]


torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
optimizers = replace(default_adamw(lr=1e-2), implementation="for-loop").build(model_parts=[model])
lr_schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(
    optimizers=optimizers, training_steps=args.steps
)
dataloader = ParallelAwareDataloader(Samples(), dp_rank=rank, dp_world_size=world, batch_size=8)
train_state = TrainState()
checkpointer = CheckpointManager.Config(
    enable=True, interval=args.every, keep_latest_k=2, last_save_model_only=False
).build(
    dataloader=dataloader,
    model_parts=[model],
    optimizers=optimizers,
    lr_schedulers=lr_schedulers,
    states={"train_state": train_state},
    sd_adapter=None,
    base_folder=args.run_dir,
)

checkpointer.load()
batches = iter(dataloader)
while train_state.step < args.steps:
    train_state.step += 1
    x, y = next(batches)
    loss = (model(x) - y).pow(2).mean()
    optimizers.zero_grad()
    loss.backward()
    for p in model.parameters():
        assert p.grad is not None
        dist.all_reduce(p.grad)
        p.grad /= world
    optimizers.step()
    lr_schedulers.step()
    total = loss.detach()
    dist.all_reduce(total)
    if rank == 0:
        print(f"step {train_state.step} loss {(total / world).item().hex()}", flush=True)
    checkpointer.save(train_state.step, last_step=train_state.step == args.steps)
checkpointer.close()
dcp.save(model.state_dict(), checkpoint_id=os.path.join(args.run_dir, "final"))
dist.destroy_process_group()
