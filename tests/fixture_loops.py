"""Training loops for the live tests: one correct loop, one buggy variant per resume bug, a
non-deterministic loop, a correct FSDP2 loop, a loop with a 1 GiB buffer, and fixtures that
fail in other ways.

Workers import this module by name (``fixture_loops:NAME``); every entry point is a plain
``(rank, world_size) -> app`` function, called after the Gloo process group is initialised.
The module is self-contained: it imports nothing from the package or from ``examples/``.
"""

from __future__ import annotations

import atexit
import math
import os
import time
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

SEED = 1234
SAMPLES = 32  # one epoch: 4 global batches, so the order is reshuffled before step 5
GLOBAL_BATCH = 8  # split evenly over 1, 2 or 4 ranks
WIDTH = 16
DROPOUT = 0.1
WARMUP = 4  # the learning rate rises over the first four steps
MAX_GRAD_NORM = 0.5


class Correct:
    """Float32 MLP, AdamW, linear warmup (LambdaLR), gradient clipping, dropout and a per-epoch
    shuffle. Dropout and the shuffle draw from one saved generator; the data position is the
    epoch's order plus a cursor; gradients and the loss are all-reduced (SUM, then divide)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        data = torch.Generator().manual_seed(SEED)
        self.inputs = torch.randn(SAMPLES, WIDTH, generator=data)
        self.targets = self.inputs.cos().mean(-1, keepdim=True)
        self.model = self.build_model()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=0.01, weight_decay=0.01, foreach=True
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / WARMUP)
        )
        self.generator = torch.Generator().manual_seed(SEED + 1)
        self.order = torch.randperm(SAMPLES, generator=self.generator)
        self.cursor = 0  # samples of self.order already consumed

    def build_model(self) -> torch.nn.Sequential:
        model = torch.nn.Sequential(
            torch.nn.Linear(WIDTH, WIDTH), torch.nn.Tanh(), torch.nn.Linear(WIDTH, 1)
        )
        init = torch.Generator().manual_seed(SEED + 2)  # not the global RNG
        for param in model.parameters():
            torch.nn.init.uniform_(param, -0.5, 0.5, generator=init)
        return model

    # -- resume state ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        model, optim = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optim": optim, **self.loop_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )
        self.load_loop_state(state_dict)

    def loop_state(self) -> dict[str, Any]:
        """Everything besides model and optimizer: identical on every rank, so saved once."""
        return {
            "sched": self.scheduler.state_dict(),
            "rng": self.generator.get_state(),
            "data": {"order": self.order, "cursor": torch.tensor(self.cursor)},
        }

    def load_loop_state(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict["sched"])
        self.generator.set_state(state_dict["rng"])
        self.order = state_dict["data"]["order"]
        self.cursor = int(state_dict["data"]["cursor"])

    # -- one step -------------------------------------------------------------------------------

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's rows of the next global batch, dropout applied to the inputs."""
        if self.cursor == SAMPLES:  # a new epoch: a new order
            self.order, self.cursor = torch.randperm(SAMPLES, generator=self.generator), 0
        index = self.order[self.cursor : self.cursor + GLOBAL_BATCH]
        self.cursor += GLOBAL_BATCH
        # The mask covers the whole global batch so the generator advances alike on all ranks.
        keep = torch.rand(GLOBAL_BATCH, WIDTH, generator=self.generator) >= DROPOUT
        inputs = self.inputs[index] * keep / (1 - DROPOUT)
        rows = GLOBAL_BATCH // self.world_size
        mine = slice(self.rank * rows, (self.rank + 1) * rows)
        return inputs[mine], self.targets[index][mine]

    def reduce_gradients(self) -> None:
        """One all-reduce for all gradients (SUM, then divide), like a DDP bucket."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        flat = torch.cat([grad.flatten() for grad in grads])
        dist.all_reduce(flat)
        flat /= self.world_size
        sizes = [grad.numel() for grad in grads]
        for grad, reduced in zip(grads, torch.split(flat, sizes), strict=True):
            grad.copy_(reduced.view_as(grad))

    def objective(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return (self.model(inputs) - targets).square().mean()

    def step(self) -> float:
        inputs, targets = self.batch()
        loss = self.objective(inputs, targets)
        self.optimizer.zero_grad()
        loss.backward()
        self.reduce_gradients()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_GRAD_NORM, foreach=True)
        self.optimizer.step()
        self.scheduler.step()
        total = loss.detach()
        dist.all_reduce(total)
        return float(total) / self.world_size


# -- bugs that a resume check must catch, one each ------------------------------------------------


class OptimizerStateNaive(Correct):
    """Checkpoints ``optimizer.state_dict()`` instead of get_state_dict/set_state_dict. A fresh
    optimizer's own state is empty, so DCP has no AdamW moments or steps to fill and the loaded
    optimizer state is silently empty (pytorch/pytorch #140898)."""

    def state_dict(self) -> dict[str, Any]:
        model, optim = self.model.state_dict(), self.optimizer.state_dict()
        return {"model": model, "optim": optim, **self.loop_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.model.load_state_dict(state_dict["model"])
        self.optimizer.load_state_dict(state_dict["optim"])
        self.load_loop_state(state_dict)


class _LeavesOut(Correct):
    """Leaves one part of the loop state out of the checkpoint; a load keeps the fresh value."""

    left_out = ""

    def loop_state(self) -> dict[str, Any]:
        return {k: v for k, v in super().loop_state().items() if k != self.left_out}

    def load_loop_state(self, state_dict: dict[str, Any]) -> None:
        fresh = super().loop_state()[self.left_out]
        super().load_loop_state({**state_dict, self.left_out: fresh})


class RngOutsideState(_LeavesOut):
    """The dropout/shuffle generator is not checkpointed, so a resumed run draws different masks
    (huggingface/transformers #17032: resuming does not restore the RNG state)."""

    left_out = "rng"


class CursorOutsideState(_LeavesOut):
    """The data position and the epoch's shuffle order are not checkpointed, so a resumed run
    starts the data over (pytorch/pytorch #36650: no state_dict for DataLoader/Sampler)."""

    left_out = "data"


class SchedulerOutsideState(_LeavesOut):
    """The LR scheduler is not checkpointed: the loaded optimizer keeps the saved lr for one step,
    then the fresh scheduler restarts the warmup (hpcaitech/ColossalAI #5151)."""

    left_out = "sched"


class AdamStepReset(Correct):
    """Resets AdamW's per-parameter ``step`` counters to 0 after set_state_dict, so bias
    correction restarts (the ``step`` counter mangled on the optimizer-state load path:
    facebookresearch/fairscale #1083)."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for state in self.optimizer.state.values():
            state["step"] = torch.zeros_like(state["step"])


class PerRankValueOneKey(Correct):
    """Adds input noise from a per-rank generator (seeded SEED + rank) and checkpoints its state
    as a plain tensor under one key. DCP assumes a plain tensor is replicated and keeps one copy,
    so at world size 2 both ranks load the same state (pytorch/pytorch #120356). At world size 1
    this loop is as correct as Correct."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        self.noise = torch.Generator().manual_seed(SEED + 100 + rank)

    def loop_state(self) -> dict[str, Any]:
        return {**super().loop_state(), "noise": self.noise.get_state()}

    def load_loop_state(self, state_dict: dict[str, Any]) -> None:
        super().load_loop_state(state_dict)
        self.noise.set_state(state_dict["noise"])

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = super().batch()
        return inputs + 0.05 * torch.randn(inputs.shape, generator=self.noise), targets


class NarrowedDtype(Correct):
    """Saves the float32 weights but restores them through a bfloat16 copy, so the loaded weights
    lose 16 mantissa bits (TensorAuto/OpenTau #185: fp32 master weights rebuilt from bf16)."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        model = {k: v.to(torch.bfloat16) for k, v in state_dict["model"].items()}
        super().load_state_dict({**state_dict, "model": model})


class RestoresRngLate(Correct):
    """Keeps the generator state it loaded and applies it at its first step, as loops that
    restore RNG state lazily do: it resumes exactly, but a checkpoint taken between the load
    and that step would hold the fresh generator."""

    pending: Any = None

    def load_loop_state(self, state_dict: dict[str, Any]) -> None:
        self.pending = state_dict["rng"]
        super().load_loop_state({**state_dict, "rng": self.generator.get_state()})

    def step(self) -> float:
        if self.pending is not None:
            self.generator.set_state(self.pending)
            self.pending = None
        return super().step()


class EpochSampler:
    """What a loop keeps of DistributedSampler: the epoch its shuffle is seeded by."""

    def __init__(self) -> None:
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch


class EpochNotSaved(Correct):
    """Reshuffles every half pass, seeded by the sampler's epoch (as DistributedSampler's
    set_epoch does), and saves the order and the cursor but not the epoch: after a resume the
    next epoch is shuffled as the first was."""

    EPOCH = SAMPLES // 2

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        self.sampler = EpochSampler()
        self.cursor = self.EPOCH  # the first step starts epoch 1

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cursor >= self.EPOCH:
            self.sampler.set_epoch(self.sampler.epoch + 1)
            shuffle = torch.Generator().manual_seed(SEED + self.sampler.epoch)
            self.order, self.cursor = torch.randperm(SAMPLES, generator=shuffle), 0
        return super().batch()


class AveragesUnsaved(Correct):
    """Trains through a GradScaler and keeps an EMA of the model (AveragedModel), and saves
    neither: every loss resumes exactly (the scale is a power of two, the EMA never reaches the
    loss), yet after a resume the scaler starts over and the EMA restarts from the model."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4, growth_interval=1)
        self.ema = torch.optim.swa_utils.AveragedModel(
            self.model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9)
        )

    def step(self) -> float:
        inputs, targets = self.batch()
        loss = (self.model(inputs) - targets).square().mean()
        self.optimizer.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.optimizer)
        self.reduce_gradients()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_GRAD_NORM, foreach=True)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.ema.update_parameters(self.model)
        total = loss.detach()
        dist.all_reduce(total)
        return float(total) / self.world_size


HEAD_FROM = 5  # the step IdleOptimizerSaved's head starts training: after the save at step 3


class IdleOptimizerSaved(Correct):
    """Its last layer (a head) has an AdamW of its own, which starts stepping at HEAD_FROM; the
    head's gradients are dropped after every step until then. When the save at step 3 reads
    state_dict(), that optimizer has no state and its parameters no gradients, so
    get_state_dict steps it with zero gradients (_init_optim_state, pytorch#140898): its step
    count is 1 before it ever trains. A run that saved trains the head differently from one
    that never saved, from step HEAD_FROM + 1 on; a resume from the save is exact."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        body, head = self.model[0], self.model[2]
        self.optimizer = torch.optim.AdamW(body.parameters(), lr=0.01, foreach=True)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / WARMUP)
        )
        self.head_optimizer = torch.optim.AdamW(head.parameters(), lr=0.01, foreach=True)
        self.steps = 0

    def state_dict(self) -> dict[str, Any]:
        model, optim = get_state_dict(self.model, [self.optimizer, self.head_optimizer])
        return {"model": model, "optim": optim, "steps": self.steps, **self.loop_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            [self.optimizer, self.head_optimizer],
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )
        self.steps = state_dict["steps"]
        self.load_loop_state(state_dict)

    def step(self) -> float:
        self.steps += 1
        loss = super().step()  # steps the body's optimizer
        if self.steps >= HEAD_FROM:
            self.head_optimizer.step()
        self.head_optimizer.zero_grad()  # set_to_none: no gradient held between steps
        return loss


class TeacherNotSaved(Correct):
    """Distils from an EMA teacher of its own model (AveragedModel) and leaves the teacher out
    of state_dict(): after a resume the teacher is rebuilt from the loaded student, so the very
    first resumed loss differs."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        self.teacher = torch.optim.swa_utils.AveragedModel(
            self.model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9)
        )

    def objective(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        out = self.model(inputs)
        with torch.no_grad():
            taught = self.teacher(inputs)
        return (out - targets).square().mean() + 0.5 * (out - taught).square().mean()

    def step(self) -> float:
        loss = super().step()
        self.teacher.update_parameters(self.model)
        return loss


class EmaNotSaved(Correct):
    """Keeps an EMA of its model for evaluation and leaves it out of state_dict(): no loss
    shows it, yet after every resume the EMA restarts from the loaded model."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        self.ema = torch.optim.swa_utils.AveragedModel(
            self.model, multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(0.9)
        )

    def step(self) -> float:
        loss = super().step()
        self.ema.update_parameters(self.model)
        return loss


class Compiled(Correct):
    """The correct loop with its model under torch.compile (the eager backend: dynamo traces
    and guards, and no C++ compiler is needed). state_dict() names the keys as the uncompiled
    model does (get_state_dict drops ``_orig_mod``); the walk goes through dynamo's wrapper."""

    def build_model(self) -> torch.nn.Sequential:
        compiled: Any = torch.compile(super().build_model(), backend="eager")
        return cast(torch.nn.Sequential, compiled)


class FrozenFirstLayer(Correct):
    """Its first layer is frozen (requires_grad False) yet handed to AdamW with the rest, as a
    fine-tuning loop often does: those parameters never get gradients or optimizer state.
    get_state_dict / set_state_dict save and load only what exists, so it resumes exactly."""

    def build_model(self) -> torch.nn.Sequential:
        model = super().build_model()
        model[0].requires_grad_(False)
        return model


class Nondeterministic(Correct):
    """Adds input noise from a generator seeded from os.urandom at every step: two identical
    uninterrupted runs differ, everything else is correct."""

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = super().batch()
        unseeded = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little"))
        return inputs + 0.05 * torch.randn(inputs.shape, generator=unseeded), targets


# -- state that differs by rank ------------------------------------------------------------------


class RankKeyed(Correct):
    """Correct, but each rank draws its rows from a sample order of its own (a sampler per
    data-parallel rank) and keeps its position under a key of its own, as torchtitan keys its
    data loader by dp_rank: ``{"loader": {"rank_<r>": ...}}``. Right at any one world size; it
    does not reshard (torchtitan issue #811), unless ``loader`` is declared rank-local."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        own = torch.Generator().manual_seed(SEED + 10 + rank)
        self.mine = torch.randperm(SAMPLES, generator=own)
        self.position = 0

    def loop_state(self) -> dict[str, Any]:
        position = {"order": self.mine, "position": torch.tensor(self.position)}
        return {**super().loop_state(), "loader": {f"rank_{self.rank}": position}}

    def load_loop_state(self, state_dict: dict[str, Any]) -> None:
        super().load_loop_state(state_dict)
        position = state_dict["loader"][f"rank_{self.rank}"]
        self.mine, self.position = position["order"], int(position["position"])

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        rows = GLOBAL_BATCH // self.world_size
        index = self.mine[(self.position + torch.arange(rows)) % SAMPLES]
        self.position += rows
        # The mask is drawn for the whole global batch: the shared generator advances alike.
        keep = torch.rand(GLOBAL_BATCH, WIDTH, generator=self.generator) >= DROPOUT
        mine = keep[self.rank * rows : (self.rank + 1) * rows]
        return self.inputs[index] * mine / (1 - DROPOUT), self.targets[index]


class LoaderWorkers(Correct):
    """Correct, with each step's batch read through a DataLoader with two worker processes:
    the batches reach the rank through multiprocessing's sockets (DupFd,
    torch/multiprocessing/reductions.py)."""

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        inputs, targets = super().batch()
        rows = torch.utils.data.TensorDataset(inputs, targets)
        loader = torch.utils.data.DataLoader(rows, batch_size=len(rows) // 2, num_workers=2)
        parts = list(loader)
        return torch.cat([x for x, _ in parts]), torch.cat([y for _, y in parts])


# -- a correct FSDP2 loop --------------------------------------------------------------------------


class Fsdp2(Correct):
    """Correct with FSDP2: every Linear, then the root, is sharded over a 1-D CPU mesh. Model and
    optimizer state come out of get_state_dict as Shard(0) DTensors that DCP can reshard. FSDP
    reduce-scatters (and averages) the gradients itself; the loss is still all-reduced."""

    def build_model(self) -> torch.nn.Sequential:
        model = super().build_model()  # identical full weights on every rank, then sharded
        mesh = init_device_mesh("cpu", (self.world_size,))
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model

    def reduce_gradients(self) -> None:
        pass


# -- a large state -------------------------------------------------------------------------------

BIG_ELEMENTS = 1 << 28  # float32: 1 GiB


class BigBuffer(Correct):
    """Correct, plus a 1 GiB float32 buffer in state_dict() of which each step changes one
    element: what the tool costs should follow the state's size, not grow with it per phase."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        self.big = torch.zeros(BIG_ELEMENTS)
        self.big_steps = 0

    def loop_state(self) -> dict[str, Any]:
        return {**super().loop_state(), "big": self.big, "big_steps": self.big_steps}

    def load_loop_state(self, state_dict: dict[str, Any]) -> None:
        super().load_loop_state(state_dict)
        self.big.copy_(state_dict["big"])  # DCP loads in place; a copy keeps it that way
        self.big_steps = state_dict["big_steps"]

    def step(self) -> float:
        loss = super().step()
        self.big_steps += 1
        self.big[(self.big_steps * 7919) % BIG_ELEMENTS] += loss
        return loss


# -- state DCP cannot save, and state it can that plain CPU tensors do not cover ----------------


class _ExtraState(Correct):
    """Correct, plus one extra tensor under ``app.extra.value`` (made by :meth:`extra`)."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        self.value = self.extra()

    def extra(self) -> torch.Tensor:
        raise NotImplementedError

    def loop_state(self) -> dict[str, Any]:
        return {**super().loop_state(), "extra": {"value": self.value}}

    def load_loop_state(self, state_dict: dict[str, Any]) -> None:
        super().load_loop_state(state_dict)
        self.value = state_dict["extra"]["value"]


class SparseState(_ExtraState):
    """A sparse COO tensor in state_dict(): DCP's writer cannot read its storage."""

    def extra(self) -> torch.Tensor:
        return torch.sparse_coo_tensor(torch.tensor([[0, 1], [1, 0]]), torch.ones(2), (2, 2))


class MetaState(_ExtraState):
    """A tensor on the meta device (never materialised): it has no data to save."""

    def extra(self) -> torch.Tensor:
        return torch.empty(4, 4, device="meta")


class NestedState(_ExtraState):
    """A nested (jagged) tensor: DCP cannot plan its write."""

    def extra(self) -> torch.Tensor:
        return torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(1, 3)], layout=torch.jagged)


class ExpandedState(_ExtraState):
    """An expanded tensor (stride 0): DCP saves it, but cannot load into it."""

    def extra(self) -> torch.Tensor:
        return torch.ones(1).expand(3)


class QuantizedState(_ExtraState):
    """A quantized tensor, which DCP saves and loads (its integer values, into a destination
    that keeps its own scale), plus a non-contiguous view."""

    def extra(self) -> torch.Tensor:
        return torch.quantize_per_tensor(torch.linspace(-1, 1, 8), 0.01, 3, torch.qint8)

    def loop_state(self) -> dict[str, Any]:
        state = super().loop_state()
        state["extra"]["view"] = self.inputs[:4].t()
        return state

    def load_loop_state(self, state_dict: dict[str, Any]) -> None:
        extra = {"value": state_dict["extra"]["value"]}
        super().load_loop_state({**state_dict, "extra": extra})


class QuantizedScaleChanges(QuantizedState):
    """Requantizes its tensor at a new scale every step. DCP saves the integer values only and
    loads them into the fresh app's tensor, which keeps its own scale (torch/distributed/
    checkpoint/filesystem.py, read_data: target_tensor.copy_): the loaded tensor holds the
    saved integers at the initial scale."""

    def step(self) -> float:
        loss = super().step()
        scale = self.value.q_scale() * 2
        self.value = torch.quantize_per_tensor(self.value.dequantize(), scale, 3, torch.qint8)
        return loss


# -- fixtures that fail in other ways --------------------------------------------------------------


class RaisesInStep(Correct):
    """Raises from its second step, to show that the user's own traceback reaches the report."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        self.steps = 0

    def step(self) -> float:
        self.steps += 1
        if self.steps == 2:
            raise ValueError("boom from the fixture")
        return super().step()


class Hangs(Correct):
    """Sleeps forever in its second step."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        self.steps = 0

    def step(self) -> float:
        self.steps += 1
        while self.steps == 2:
            time.sleep(1.0)
        return super().step()


class BadLoss(Correct):
    """Trains correctly but reports a NaN loss."""

    def step(self) -> float:
        super().step()
        return math.nan


class NanAtStep(Correct):
    """Returns a NaN loss from its fifth step on (the first is finite, so the probe passes)."""

    def __init__(self, rank: int, world_size: int) -> None:
        super().__init__(rank, world_size)
        self.steps = 0

    def loop_state(self) -> dict[str, Any]:
        return {**super().loop_state(), "steps": self.steps}

    def load_loop_state(self, state_dict: dict[str, Any]) -> None:
        super().load_loop_state(state_dict)
        self.steps = state_dict["steps"]

    def step(self) -> float:
        self.steps += 1
        loss = super().step()
        return math.nan if self.steps >= 5 else loss


class NoStep:
    """Stateful, but has no step()."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.app = Correct(rank, world_size)

    def state_dict(self) -> dict[str, Any]:
        return self.app.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.app.load_state_dict(state_dict)


class NotAMapping:
    """state_dict() returns a list of the correct loop's state instead of a mapping."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.app = Correct(rank, world_size)

    def state_dict(self) -> list[Any]:
        return list(self.app.state_dict().values())

    def load_state_dict(self, state_dict: list[Any]) -> None:
        self.app.load_state_dict(dict(zip(self.app.state_dict(), state_dict, strict=True)))

    def step(self) -> float:
        return self.app.step()


# -- entry points ----------------------------------------------------------------------------------


def correct(rank: int, world_size: int) -> Correct:
    return Correct(rank, world_size)


# How long rank 1 of ``slow_exit_on_rank_1`` takes to exit: past torchrun's next rendezvous.
SLOW_EXIT_SECONDS = 4.0
_slow_exit: list[bool] = []


def slow_exit_on_rank_1(rank: int, world_size: int) -> Correct:
    """A correct loop whose rank 1 takes seconds to exit, as a logger flushing at exit does (an
    atexit handler): its node's workers end later than the others' after every attempt."""
    if rank == 1 and not _slow_exit:
        _slow_exit.append(True)
        atexit.register(time.sleep, SLOW_EXIT_SECONDS)
    return Correct(rank, world_size)


def needs_width(rank: int, world_size: int, width: int) -> Correct:
    """A fixture with an argument of its own and no default: not callable as (rank, world_size),
    and called with ``--fixture-arg width=16``, it checks that the value arrived as given."""
    if width != WIDTH:
        raise ValueError(f"width {width!r}, expected {WIDTH}")
    return Correct(rank, world_size)


def loader_workers(rank: int, world_size: int) -> Correct:
    return LoaderWorkers(rank, world_size)


def rank_keyed(rank: int, world_size: int) -> Correct:
    return RankKeyed(rank, world_size)


def optimizer_state_naive(rank: int, world_size: int) -> Correct:
    return OptimizerStateNaive(rank, world_size)


def rng_outside_state(rank: int, world_size: int) -> Correct:
    return RngOutsideState(rank, world_size)


def cursor_outside_state(rank: int, world_size: int) -> Correct:
    return CursorOutsideState(rank, world_size)


def scheduler_outside_state(rank: int, world_size: int) -> Correct:
    return SchedulerOutsideState(rank, world_size)


def adam_step_reset(rank: int, world_size: int) -> Correct:
    return AdamStepReset(rank, world_size)


def per_rank_value_one_key(rank: int, world_size: int) -> Correct:
    return PerRankValueOneKey(rank, world_size)


def narrowed_dtype(rank: int, world_size: int) -> Correct:
    return NarrowedDtype(rank, world_size)


def restores_rng_late(rank: int, world_size: int) -> Correct:
    return RestoresRngLate(rank, world_size)


def epoch_not_saved(rank: int, world_size: int) -> Correct:
    return EpochNotSaved(rank, world_size)


def averages_unsaved(rank: int, world_size: int) -> Correct:
    return AveragesUnsaved(rank, world_size)


def idle_optimizer_saved(rank: int, world_size: int) -> Correct:
    return IdleOptimizerSaved(rank, world_size)


def teacher_not_saved(rank: int, world_size: int) -> Correct:
    return TeacherNotSaved(rank, world_size)


def ema_not_saved(rank: int, world_size: int) -> Correct:
    return EmaNotSaved(rank, world_size)


def compiled(rank: int, world_size: int) -> Correct:
    return Compiled(rank, world_size)


def frozen_first_layer(rank: int, world_size: int) -> Correct:
    return FrozenFirstLayer(rank, world_size)


def nondeterministic(rank: int, world_size: int) -> Correct:
    return Nondeterministic(rank, world_size)


def fsdp2(rank: int, world_size: int) -> Correct:
    return Fsdp2(rank, world_size)


def raises_in_step(rank: int, world_size: int) -> Correct:
    return RaisesInStep(rank, world_size)


def hangs(rank: int, world_size: int) -> Correct:
    return Hangs(rank, world_size)


def bad_loss(rank: int, world_size: int) -> Correct:
    return BadLoss(rank, world_size)


def no_step(rank: int, world_size: int) -> NoStep:
    return NoStep(rank, world_size)


def not_a_mapping(rank: int, world_size: int) -> NotAMapping:
    return NotAMapping(rank, world_size)


def big_buffer(rank: int, world_size: int) -> Correct:
    return BigBuffer(rank, world_size)


def nan_at_step_5(rank: int, world_size: int) -> Correct:
    return NanAtStep(rank, world_size)


def sparse_state(rank: int, world_size: int) -> Correct:
    return SparseState(rank, world_size)


def meta_state(rank: int, world_size: int) -> Correct:
    return MetaState(rank, world_size)


def nested_state(rank: int, world_size: int) -> Correct:
    return NestedState(rank, world_size)


def expanded_state(rank: int, world_size: int) -> Correct:
    return ExpandedState(rank, world_size)


def quantized_state(rank: int, world_size: int) -> Correct:
    return QuantizedState(rank, world_size)


def quantized_scale_changes(rank: int, world_size: int) -> Correct:
    return QuantizedScaleChanges(rank, world_size)
