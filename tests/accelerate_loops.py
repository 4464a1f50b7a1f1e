"""Accelerate loops for the adapter's tests (``accelerate_loops:NAME``): the example
(``examples/accelerate_fixture.py``) as it is, and with one planted bug each.

Accelerate 1.15.0 saves no data position for a map-style DataLoader (``save_accelerator_state``
in accelerate/checkpointing.py writes a sampler only for an ``IterableDatasetShard``, and a
loader's ``state_dict`` only with torchdata's StatefulDataLoader): the example keeps its epoch
and batch in an object registered with ``register_for_checkpointing``, whose state
``save_state`` writes as ``custom_checkpoint_0.pkl``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from dcp_invariant.adapters import accelerate as accelerate_adapter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import accelerate_fixture


def correct(rank: int, world_size: int) -> accelerate_adapter.AccelerateApp:
    app: accelerate_adapter.AccelerateApp = accelerate_fixture.fixture(rank, world_size)
    return app


def position_not_registered(rank: int, world_size: int) -> accelerate_adapter.AccelerateApp:
    """The data position is never registered, so save_state neither saves nor restores it."""

    def build(make_accelerator: Any) -> accelerate_adapter.Built:
        def make(**kwargs: Any) -> Any:
            accelerator = make_accelerator(**kwargs)
            accelerator.register_for_checkpointing = lambda *objects: None  # the bug
            return accelerator

        built: accelerate_adapter.Built = accelerate_fixture.build(make)
        return built

    return accelerate_adapter.app(build)


def restarts_the_epoch(rank: int, world_size: int) -> accelerate_adapter.AccelerateApp:
    """Resumes at the start of the saved epoch, as loops that save only the epoch do: the
    batches already taken in it are taken again."""
    app = correct(rank, world_size)
    load = app.load

    def restarting(checkpoint_dir: str) -> None:
        load(checkpoint_dir)
        for position in app.accelerator._custom_objects:  # the registered objects
            position.batch = 0

    setattr(app, "load", restarting)  # noqa: B010  # an instance's own, in place of the method
    return app


def batch_norm(rank: int, world_size: int) -> accelerate_adapter.AccelerateApp:
    """The example with a BatchNorm (statistics only) after its first layer: under DDP each
    rank's statistics come from its shard of the batch, save_state writes the main process's
    model alone, and DDP's forward broadcasts rank 0's buffers: an exact resume."""
    import torch

    def build(make_accelerator: Any) -> accelerate_adapter.Built:
        def make(**kwargs: Any) -> Any:
            accelerator = make_accelerator(**kwargs)
            prepare = accelerator.prepare

            def with_batch_norm(model: Any, *rest: Any) -> Any:
                model.insert(1, torch.nn.BatchNorm1d(8, affine=False))
                return prepare(model, *rest)

            accelerator.prepare = with_batch_norm
            return accelerator

        built: accelerate_adapter.Built = accelerate_fixture.build(make)
        return built

    return accelerate_adapter.app(build)


def fsdp2_plugin(rank: int, world_size: int) -> accelerate_adapter.AccelerateApp:
    """The example's loop given Accelerate's FSDP2 plugin, which Accelerate drops on CPU."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    def build(make_accelerator: Any) -> accelerate_adapter.Built:
        make_accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
        raise AssertionError("the adapter accepted a dropped FSDP plugin")

    return accelerate_adapter.app(build)
