"""Hugging Face Accelerate: a loop that checkpoints with ``accelerator.save_state``/
``load_state``, as an app that saves itself.

The fixture hands :func:`app` a function that builds the loop from an Accelerator the adapter
makes::

    from dcp_invariant.adapters import accelerate as accelerate_adapter

    def build(make_accelerator):
        accelerator = make_accelerator(dataloader_config=DataLoaderConfiguration(...))
        model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, sched)
        accelerator.register_for_checkpointing(progress)  # any other object with state
        def step() -> float: ...  # one training step; returns the loss
        return accelerator, step

    def fixture(rank, world_size):
        return accelerate_adapter.app(build)

``make_accelerator(**kwargs)`` is ``Accelerator(cpu=True, **kwargs)`` on the tool's process
group. Accelerate has no way to be handed a group: ``PartialState`` reads the launcher's
variables (``get_cpu_distributed_information`` in accelerate/utils/environment.py) and, with
``cpu=True``, takes the MULTI_CPU path only when ``LOCAL_RANK`` or ``WORLD_SIZE`` says so
(``_prepare_backend`` in accelerate/state.py); it then reuses the group that is up
(``if not torch.distributed.is_initialized()`` before its ``init_process_group``). So the
adapter sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` from the group
where they are unset (under torchrun they are set, and left alone), and checks that the
Accelerator counts the group's ranks. Accelerate's state is process-wide singletons
(``PartialState``, ``AcceleratorState``, ``GradientState``, each a ``SharedDict`` in
accelerate/state.py), so each ``make_accelerator`` first resets them, and puts back the
environment variables the previous Accelerator made in this process (:func:`reset`).

The app's ``save(dir)`` is ``accelerator.save_state(dir)`` and its ``load(dir)`` is
``accelerator.load_state(dir)``. On CPU (MULTI_CPU: DDP, or no wrapper at one rank) they write
flat files into ``dir``: rank 0 writes ``model.safetensors``, ``optimizer.bin``,
``scheduler.bin`` and one ``custom_checkpoint_<i>.pkl`` per registered object, every rank its
own ``random_states_<rank>.pkl`` (``save_accelerator_state`` and ``save_custom_state`` in
accelerate/checkpointing.py; ``save`` in accelerate/utils/other.py writes on the main process
only). Its ``state_dict()`` shows the tool what those files hold, under their names: each
prepared model (unwrapped), optimizer and scheduler, each registered object's
``state_dict()``, and the RNG states and step counter of ``random_states``.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from dcp_invariant.adapters import framework
from dcp_invariant.errors import FixtureError

# What build returns: the Accelerator and one training step.
Built = tuple[Any, Callable[[], float]]

# The launcher's variables PartialState reads (module docstring), set where unset.
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")

# The environment as it was before the last Accelerator this adapter made changed it (the
# launcher's variables it set, ``ACCELERATE_USE_FSDP`` and ``MASTER_PORT`` that Accelerate sets
# itself): put back by reset(), so a fixture built later in this worker starts from the same.
_changed: dict[str, str | None] = {}


def app(build: Callable[[Callable[..., Any]], Built], *, reshards: bool = False) -> AccelerateApp:
    """The loop ``build`` makes, as an app that checkpoints through Accelerate.

    ``reshards``: declare that its checkpoint loads at another world size, so that the tool
    checks ``reshard_<a>_to_<b>`` too.
    """
    accelerate = framework("accelerate", "accelerate", "accelerate")
    accelerator, step = build(lambda **kwargs: _accelerator(accelerate, kwargs))
    if not isinstance(accelerator, accelerate.Accelerator):
        raise FixtureError(
            f"the build given to dcp_invariant.adapters.accelerate.app returned a "
            f"{type(accelerator).__name__} where the Accelerator goes: return "
            "(make_accelerator(...), step)"
        )
    return AccelerateApp(accelerator, step, reshards)


class AccelerateApp:
    """An Accelerate loop with ``step``, ``save``, ``load`` and a ``state_dict`` to compare."""

    def __init__(self, accelerator: Any, step: Callable[[], float], reshards: bool = False) -> None:
        self.accelerator = accelerator
        self._step = step
        self.reshards = reshards  # what the app declares (dcp_invariant.plan.AppShape)

    def step(self) -> float:
        return self._step()

    def save(self, checkpoint_dir: str) -> None:
        self.accelerator.save_state(checkpoint_dir)

    def load(self, checkpoint_dir: str) -> None:
        self.accelerator.load_state(checkpoint_dir)

    def state_dict(self) -> dict[str, Any]:
        """What ``save_state`` writes, by the stem of the file it writes it to (module
        docstring); ``random_states`` is this rank's."""
        accelerator = self.accelerator
        state: dict[str, Any] = {}
        for i, model in enumerate(accelerator._models):
            state[_name("model", i)] = accelerator.unwrap_model(model).state_dict()
        for i, optimizer in enumerate(accelerator._optimizers):
            state[_name("optimizer", i)] = optimizer.state_dict()
        for i, scheduler in enumerate(accelerator._schedulers):
            state[_name("scheduler", i)] = scheduler.state_dict()
        for i, obj in enumerate(accelerator._custom_objects):
            state[f"custom_checkpoint_{i}"] = obj.state_dict()
        state["random_states"] = _random_states(accelerator)
        return state


def reset() -> None:
    """Accelerate's process-wide state as it was before the last Accelerator the adapter made:
    its singletons cleared and the environment variables that Accelerator changed put back.

    ``make_accelerator`` calls this first; a test that builds an app in its own process calls it
    after. The ``_reset_state`` methods are Accelerate's own (accelerate/state.py), which its
    test utilities call between tests for the same reason.
    """
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    for name, value in _changed.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _changed.clear()


@contextlib.contextmanager
def on_the_tools_group() -> Iterator[tuple[int, int]]:
    """Within, Accelerate's state is fresh (:func:`reset`) and the launcher's variables are set
    from the tool's process group where unset, so an Accelerator made there (or a
    ``PartialState``, as Hugging Face's ``TrainingArguments`` makes) reuses the group that is up;
    the group's ``(rank, world_size)``. What it changed in the environment is put back by the
    next :func:`reset`, and torch's thread count at once."""
    import torch
    import torch.distributed as dist

    reset()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    before = dict(os.environ)
    # The tool's own workers are one node: each is its own local rank.
    launcher = {
        "RANK": rank,
        "WORLD_SIZE": world_size,
        "LOCAL_RANK": rank,
        "LOCAL_WORLD_SIZE": world_size,
    }
    for name in LAUNCHER_VARIABLES:
        os.environ.setdefault(name, str(launcher[name]))
    # With OMP_NUM_THREADS unset, PartialState sets torch's thread count to the physical cores
    # per local rank (accelerate/state.py): the tool's thread count stays as the tool set it.
    threads = torch.get_num_threads()
    try:
        yield rank, world_size
    finally:
        torch.set_num_threads(threads)
        for name in set(before) | set(os.environ):
            if os.environ.get(name) != before.get(name):
                _changed[name] = before.get(name)


def _name(stem: str, i: int) -> str:
    # As save_accelerator_state names the files of the second and later objects of a kind.
    return stem if i == 0 else f"{stem}_{i}"


def _accelerator(accelerate: Any, kwargs: Mapping[str, Any]) -> Any:
    """An Accelerator on CPU over the tool's process group (module docstring)."""
    import torch.distributed as dist

    if "cpu" in kwargs:
        raise FixtureError(
            "make_accelerator(cpu=...): the adapter runs Accelerate on the tool's CPU process "
            "group (cpu=True); leave it out"
        )
    if not dist.is_initialized():
        raise FixtureError(
            "dcp_invariant.adapters.accelerate needs the tool's process group, which is not up: "
            "build the app in a fixture the tool calls"
        )
    with on_the_tools_group() as (rank, world_size):
        accelerator = accelerate.Accelerator(cpu=True, **kwargs)
    counted = (accelerator.num_processes, accelerator.process_index)
    if counted != (world_size, rank):
        raise FixtureError(
            f"Accelerate counts {counted[0]} processes and this one as rank {counted[1]}, the "
            f"tool's process group {world_size} and rank {rank}: RANK, WORLD_SIZE or LOCAL_RANK "
            "in the environment disagree with the group"
        )
    _refuse_dropped_fsdp(accelerator)
    if accelerator.project_configuration.automatic_checkpoint_naming:
        # save_state then writes under project_dir/checkpoints/checkpoint_<i> and load_state
        # reads the newest there, whatever directory they are given (accelerate/accelerator.py):
        # not the directory the tool seals and hands back.
        raise FixtureError(
            "ProjectConfiguration(automatic_checkpoint_naming=True): Accelerate would save and "
            "load outside the directory the tool gives it; leave it False for the check"
        )
    return accelerator


def _refuse_dropped_fsdp(accelerator: Any) -> None:
    """An FSDP plugin Accelerate took and does not use stops the run instead of testing DDP.

    Given a plugin (or ``ACCELERATE_USE_FSDP=true``), the Accelerator sets
    ``ACCELERATE_USE_FSDP=true`` (accelerate/accelerator.py), but ``AcceleratorState`` switches
    to FSDP only when the distributed type is one of the GPU-like ``MULTI_*`` ones, a list
    without MULTI_CPU (``self.distributed_type = DistributedType.FSDP`` in accelerate/state.py,
    1.15.0): with ``cpu=True`` it stays MULTI_CPU, ``prepare`` wraps the model in DDP, and
    nothing says so.
    """
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return
    if accelerator.distributed_type == "FSDP":  # DistributedType is a str enum
        return
    raise FixtureError(
        f"Accelerate dropped its FSDP plugin: on CPU it runs {accelerator.distributed_type.value} "
        "(its AcceleratorState turns to FSDP for GPU-like devices only, accelerate/state.py), so "
        "the loop would be tested under DDP; leave fsdp_plugin out (and ACCELERATE_USE_FSDP "
        "unset) to test DDP, or run the loop on GPUs"
    )


def _random_states(accelerator: Any) -> dict[str, Any]:
    """What ``random_states_<rank>.pkl`` holds on CPU (``save_accelerator_state`` in
    accelerate/checkpointing.py), as tensors: Python's, NumPy's and torch's global generators,
    and the Accelerator's step counter (gradient accumulation)."""
    python, numpy, torch_state = global_rng_states()
    return {
        "step": int(accelerator.step),
        "random_state": python,
        "numpy_random_seed": numpy,
        "torch_manual_seed": torch_state,
    }


def global_rng_states() -> tuple[dict[str, Any], dict[str, Any], Any]:
    """Python's, NumPy's and torch's global generator states as a state dict holds them: numbers
    and tensors, which ``state_dict()`` compares key by key (frameworks pickle the tuples)."""
    import numpy as np
    import torch

    version, python_state, gauss = random.getstate()
    _, numpy_keys, numpy_pos, has_gauss, cached_gaussian = np.random.get_state()
    python = {
        "version": version,
        "state": torch.tensor(python_state, dtype=torch.int64),
        "gauss": gauss,
    }
    numpy = {
        "keys": torch.from_numpy(np.asarray(numpy_keys, dtype=np.int64)),
        "pos": int(numpy_pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }
    return python, numpy, torch.get_rng_state()
