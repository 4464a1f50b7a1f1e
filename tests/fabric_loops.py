"""Lightning Fabric loops for the adapter's tests (``fabric_loops:NAME``): the example
(``examples/fabric_fixture.py``) as it is, under DDPStrategy, and trusting ``fabric.load``.

Under DDPStrategy, Fabric restores every stateful entry of the state in place. Under
ModelParallelStrategy (FSDP2), Lightning 2.6.6 replaces each one with the raw state dict it
read (``state[key] = metadata.pop(key)`` in lightning/fabric/strategies/model_parallel.py):
a loop that trusts ``fabric.load`` resumes with a fresh scheduler and data position, and the
example restores them itself.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.strategies import DDPStrategy

from dcp_invariant.adapters import fabric as fabric_adapter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import fabric_fixture


def model_parallel(rank: int, world_size: int) -> fabric_adapter.FabricApp:
    app: fabric_adapter.FabricApp = fabric_fixture.fixture(rank, world_size)
    return app


def model_parallel_trusting_fabric_load(rank: int, world_size: int) -> fabric_adapter.FabricApp:
    return fabric_adapter.app(fabric_fixture.build)


def ddp(rank: int, world_size: int) -> fabric_adapter.FabricApp:
    """The example's loop under DDPStrategy, whose load restores stateful objects itself."""

    def build(make_fabric: Any) -> fabric_adapter.Built:
        def make(**kwargs: Any) -> Any:
            return make_fabric(**{**kwargs, "strategy": DDPStrategy(process_group_backend="gloo")})

        built: fabric_adapter.Built = fabric_fixture.build(make)
        return built

    return fabric_adapter.app(build)


def ddp_batch_norm(rank: int, world_size: int) -> fabric_adapter.FabricApp:
    """A BatchNorm model under DDPStrategy: each rank's running statistics come from its own
    batch, and fabric.save writes global rank 0's state alone, so rank 1 resumes rank 0's,
    which DDP's next forward broadcasts to it anyway: an exact resume."""

    def build(make_fabric: Any) -> fabric_adapter.Built:
        fabric = make_fabric(strategy=DDPStrategy(process_group_backend="gloo"))
        inputs = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
        targets = inputs.cos().mean(-1, keepdim=True)
        torch.manual_seed(0)  # initial weights only
        model = fabric.setup_module(
            torch.nn.Sequential(
                torch.nn.Linear(16, 16),
                torch.nn.BatchNorm1d(16),
                torch.nn.Tanh(),
                torch.nn.Linear(16, 1),
            )
        )
        optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=0.01))
        position = fabric_fixture.Position()
        state = {"model": model, "optimizer": optimizer, "position": position}
        rows = 8 // fabric.world_size
        mine = slice(fabric.global_rank * rows, (fabric.global_rank + 1) * rows)

        def step() -> float:
            batch = torch.randperm(64, generator=position.gen)[:8]
            position.cursor += 1
            loss = (model(inputs[batch][mine]) - targets[batch][mine]).square().mean()
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            return float(fabric.all_reduce(loss.detach(), reduce_op="mean"))

        return fabric, state, step

    return fabric_adapter.app(build)
