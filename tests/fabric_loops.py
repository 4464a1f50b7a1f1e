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
