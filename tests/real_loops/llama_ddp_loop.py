"""A data-parallel loop over real code: a tiny ``transformers`` Llama fed by ``torchdata``'s
``StatefulDataLoader``, checkpointed as ``{"model", "optim", "sched", "data", "rng"}``.

Every rank iterates the same loader (one seeded shuffle of the global batches) and trains on its
own rows of each global batch, so the loader's state is the same on every rank and is saved once,
under one key: it reshards to any world size. Gradients and the loss are all-reduced (SUM, then
divided by the world size). The global RNG is saved too: every ``iter()`` of the loader draws the
workers' base seed from it (``torch/utils/data/dataloader.py``, ``_BaseDataLoaderIter``), and
with workers that seed is part of the loader's state.

``fixture(rank, world_size, num_workers=0, bug=None)``; ``--fixture-arg`` selects a variant:

- ``num_workers``: the loader's worker processes (0 or 2 in the tests); with workers its state
  holds each worker's snapshot and the base seed they were started with.
- ``bug="loader_not_saved"``: ``state_dict()`` leaves the loader out, so a resumed run starts
  the data over (pytorch/pytorch #36650, the gap ``StatefulDataLoader`` was written to close).
- ``bug="scheduler_not_saved"``: the LR schedule is left out, so the fresh scheduler restarts the
  warmup after the first resumed step (hpcaitech/ColossalAI #5151).
- ``bug="loader_generator"``: the shuffle generator is passed as ``StatefulDataLoader(...,
  generator=g)`` instead of to the sampler. torchdata 0.11.0 then resumes the current epoch but
  not the next one: every ``iter()`` draws the permutation and then the workers' base seed from
  ``g`` (``torch/utils/data/dataloader.py``, ``_BaseDataLoaderIter.__init__``), the saved state
  is ``g`` before the permutation, and a load replays only the permutation, so ``g`` resumes one
  draw short and the next epoch is shuffled differently. Found by running this loop through the
  tool; measured with torchdata 0.11.0 alone too (a fresh loader, ``load_state_dict``, the next
  epoch's batches).
- ``bug="global_rng_not_saved"``: the global RNG is left out. With workers, the next epoch's base
  seed differs: a fresh process has drawn other seeds by then (one for the loader's state before
  the load, one for the iterator the load rebuilds), as HF Trainer's saved ``rng_state`` guards
  against. Without workers the seed is not in the loader's state and nothing differs.
"""

from __future__ import annotations

from typing import Any

import tiny_llama
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler

SAMPLES = 32
GLOBAL_BATCH = 8  # one epoch is 4 steps: the default 3 + 3 steps cross a reshuffle
BUGS = (None, "loader_not_saved", "scheduler_not_saved", "loader_generator", "global_rng_not_saved")


class LlamaDdp:
    def __init__(self, rank: int, world_size: int, num_workers: int, bug: str | None) -> None:
        if GLOBAL_BATCH % world_size or bug not in BUGS:
            raise ValueError(
                f"world size {world_size} or bug {bug!r} is not a variant of this loop"
            )
        self.rank, self.world_size, self.bug = rank, world_size, bug
        self.model = tiny_llama.build_model()
        self.optimizer, self.scheduler = tiny_llama.build_optimizer(self.model.parameters())
        dataset = torch.utils.data.TensorDataset(tiny_llama.token_rows(SAMPLES))
        # The shuffle draws from a generator of its own, not the global RNG; torchdata's
        # RandomSampler saves its state at the start of each epoch and replays the order from it.
        shuffle = torch.Generator().manual_seed(tiny_llama.SEED + 3)
        on_loader = bug == "loader_generator"
        self.loader = StatefulDataLoader(
            dataset,
            batch_size=GLOBAL_BATCH,
            sampler=None if on_loader else RandomSampler(dataset, generator=shuffle),
            shuffle=True if on_loader else None,
            generator=shuffle if on_loader else None,
            drop_last=True,
            num_workers=num_workers,
        )
        self.batches: Any = None  # the epoch's iterator; a loaded state applies at the next iter()

    def state_dict(self) -> dict[str, Any]:
        model, optim = get_state_dict(self.model, self.optimizer)
        state = {"model": model, "optim": optim}
        if self.bug != "scheduler_not_saved":
            state["sched"] = self.scheduler.state_dict()
        if self.bug != "loader_not_saved":
            state["data"] = self.loader.state_dict()
        if self.bug != "global_rng_not_saved":
            state["rng"] = torch.get_rng_state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )
        if self.bug != "scheduler_not_saved":
            self.scheduler.load_state_dict(state_dict["sched"])
        if self.bug != "loader_not_saved":
            self.loader.load_state_dict(state_dict["data"])
            # The saved epoch resumes here, not at the next step: building its iterator draws a
            # base seed from the global RNG (then replaced by the saved one), so the RNG is
            # restored after that draw.
            self.batches = iter(self.loader)
        if self.bug != "global_rng_not_saved":
            torch.set_rng_state(state_dict["rng"])

    def next_batch(self) -> torch.Tensor:
        if self.batches is None:
            self.batches = iter(self.loader)
        try:
            (tokens,) = next(self.batches)
        except StopIteration:  # the epoch is over: the next one reshuffles
            self.batches = iter(self.loader)
            (tokens,) = next(self.batches)
        rows = GLOBAL_BATCH // self.world_size
        return tokens[self.rank * rows : (self.rank + 1) * rows]

    def step(self) -> float:
        loss = tiny_llama.causal_lm_loss(self.model, self.next_batch())
        self.optimizer.zero_grad()
        loss.backward()
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        flat = torch.cat([grad.flatten() for grad in grads])  # one bucket, as DDP reduces
        dist.all_reduce(flat)
        flat /= self.world_size
        for grad, reduced in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
            grad.copy_(reduced.view_as(grad))
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), tiny_llama.MAX_GRAD_NORM)
        self.optimizer.step()
        self.scheduler.step()
        total = loss.detach()
        dist.all_reduce(total)
        return float(total) / self.world_size


def fixture(rank: int, world_size: int, num_workers: int = 0, bug: str | None = None) -> LlamaDdp:
    return LlamaDdp(rank, world_size, num_workers, bug)
