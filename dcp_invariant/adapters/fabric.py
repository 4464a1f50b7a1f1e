"""Lightning Fabric: a loop that checkpoints with ``fabric.save``/``fabric.load``, as an app
that saves itself.

The fixture hands :func:`app` a function that builds the loop from a Fabric the adapter
makes::

    from dcp_invariant.adapters import fabric as fabric_adapter

    def build(make_fabric):
        fabric = make_fabric(strategy=ModelParallelStrategy(parallelize), precision="32-true")
        model, optimizer = fabric.setup(model, optimizer)
        state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "step": 0}
        def step() -> float: ...  # one training step; returns the loss
        return fabric, state, step

    def fixture(rank, world_size):
        return fabric_adapter.app(build)

``make_fabric(**kwargs)`` is ``Fabric(accelerator="cpu", devices=..., num_nodes=...,
plugins=[...], **kwargs)``, launched: its devices, nodes and ranks are the tool's process group
(which Fabric then reuses: ``_init_dist_connection`` returns early when torch.distributed is
initialised, lightning/fabric/utilities/distributed.py), under the tool's workers and under
torchrun alike, so no launcher variable needs faking.

The app's ``save(dir)`` is ``fabric.save(path, state)`` and its ``load(dir)`` is
``fabric.load(path, state)`` (or the loop's own ``save``/``load`` functions, given to
:func:`app`, which is what a loop that works around its framework should pass). ``path`` is
``dir`` itself for a strategy that saves a sharded checkpoint (a directory of DCP files and
Fabric's ``meta.pt``), else a file in it. Its ``state_dict()`` shows the tool each entry of
``state`` as the objects built for it hold it: a module's and an optimizer's state, a
stateful object's ``state_dict()``, a plain value as it is. It reads the objects ``build``
made, not what ``state`` holds after a load, so a stateful object that a load replaces
instead of restoring is seen as it stayed.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

from dcp_invariant.adapters import framework
from dcp_invariant.errors import FixtureError

# What build returns: the Fabric, the state fabric.save checkpoints, and one training step.
Built = tuple[Any, dict[str, Any], Callable[[], float]]
# save(fabric, path, state) and load(fabric, path, state): the loop's own checkpoint code.
Checkpointer = Callable[[Any, str, dict[str, Any]], object]

# The file a strategy that saves one file writes into the tool's directory.
CHECKPOINT_FILE = "checkpoint.ckpt"


def app(
    build: Callable[[Callable[..., Any]], Built],
    *,
    save: Checkpointer | None = None,
    load: Checkpointer | None = None,
    reshards: bool = False,
) -> FabricApp:
    """The loop ``build`` makes, as an app that checkpoints through Fabric.

    ``reshards``: declare that its checkpoint loads at another world size (a sharded checkpoint
    of ModelParallelStrategy or FSDPStrategy is DCP's, which reshards), so that the tool checks
    ``reshard_<a>_to_<b>`` too.
    """
    lightning = framework("lightning.fabric", "lightning", "fabric")
    fabric, state, step = build(lambda **kwargs: _launched(lightning, kwargs))
    return FabricApp(fabric, state, step, save, load, reshards)


class FabricApp:
    """A Fabric loop with ``step``, ``save``, ``load`` and a ``state_dict`` to compare."""

    def __init__(
        self,
        fabric: Any,
        state: dict[str, Any],
        step: Callable[[], float],
        save: Checkpointer | None,
        load: Checkpointer | None,
        reshards: bool = False,
    ) -> None:
        self.fabric = fabric
        self.state = state
        self.reshards = reshards  # what the app declares (dcp_invariant.plan.AppShape)
        self._step = step
        self._save = save or (lambda f, path, s: f.save(path, s))
        self._load = load or (lambda f, path, s: f.load(path, s))
        # The objects build made, by key: what the tool compares after a load (module docstring).
        self._built = {k: v for k, v in state.items() if callable(getattr(v, "state_dict", None))}

    def step(self) -> float:
        return self._step()

    def save(self, checkpoint_dir: str) -> None:
        self._save(self.fabric, self._path(checkpoint_dir), self.state)

    def load(self, checkpoint_dir: str) -> None:
        self._load(self.fabric, self._path(checkpoint_dir), self.state)

    def state_dict(self) -> dict[str, Any]:
        return {
            key: self._built[key].state_dict() if key in self._built else value
            for key, value in self.state.items()
        }

    def _path(self, checkpoint_dir: str) -> str:
        if _saves_a_directory(self.fabric.strategy):
            return checkpoint_dir
        return os.path.join(checkpoint_dir, CHECKPOINT_FILE)


def _saves_a_directory(strategy: Any) -> bool:
    """Whether ``fabric.save`` writes a directory: ModelParallelStrategy and FSDPStrategy save a
    sharded checkpoint so unless told to save a full state dict, which is one file written by
    rank 0 (``_save_checkpoint`` in lightning/fabric/strategies/model_parallel.py and
    ``FSDPStrategy.save_checkpoint`` in lightning/fabric/strategies/fsdp.py, Lightning 2.6.6);
    every other strategy writes one file."""
    from lightning.fabric.strategies import FSDPStrategy, ModelParallelStrategy

    if isinstance(strategy, ModelParallelStrategy):
        return bool(strategy._save_distributed_checkpoint)
    if isinstance(strategy, FSDPStrategy):
        return bool(strategy._state_dict_type == "sharded")
    return False


def _launched(lightning: Any, kwargs: Mapping[str, Any]) -> Any:
    """A Fabric on this process group's devices, nodes and ranks, launched."""
    import torch.distributed as dist

    for name in ("accelerator", "devices", "num_nodes"):
        if name in kwargs:
            raise FixtureError(
                f"make_fabric({name}=...): the adapter sets {name} from the tool's process group "
                "(CPU, its ranks); leave it out"
            )
    world_size = dist.get_world_size()
    # Under torchrun each node runs LOCAL_WORLD_SIZE ranks; the tool's own workers are one node.
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    plugins = [*kwargs.get("plugins", []), _environment()()]
    fabric = lightning.Fabric(
        accelerator="cpu",
        devices=devices,
        num_nodes=world_size // devices,
        **{**kwargs, "plugins": plugins},
    )
    fabric.launch()
    return fabric


def _environment() -> type:
    """Fabric's cluster environment for the tool's process group: processes are created
    externally (so ``launch()`` starts none), and ranks are the group's."""
    import torch.distributed as dist
    from lightning.fabric.plugins.environments import ClusterEnvironment
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    class ToolGroup(ClusterEnvironment):  # type: ignore[misc]  # Lightning is untyped to mypy
        @property
        def creates_processes_externally(self) -> bool:
            return True

        @property
        def main_address(self) -> str:
            # Unused: the process group is up before Fabric is made.
            return os.environ.get("MASTER_ADDR", "127.0.0.1")

        @property
        def main_port(self) -> int:
            return int(os.environ.get("MASTER_PORT", "0"))

        @staticmethod
        def detect() -> bool:
            return True

        def world_size(self) -> int:
            return int(dist.get_world_size())

        def set_world_size(self, size: int) -> None:
            if size != dist.get_world_size():
                raise ValueError(
                    f"Fabric counts {size} processes, the group has {dist.get_world_size()}"
                )

        def global_rank(self) -> int:
            return int(dist.get_rank())

        def set_global_rank(self, rank: int) -> None:
            rank_zero_only.rank = rank  # as LightningEnvironment does, for rank-zero logging

        def local_rank(self) -> int:
            return int(os.environ.get("LOCAL_RANK", dist.get_rank()))

        def node_rank(self) -> int:
            return int(os.environ.get("GROUP_RANK", 0))

    return ToolGroup
