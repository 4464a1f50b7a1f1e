"""Training loops built on data loaders, as users write them (torchdata's StatefulDataLoader,
torch's DataLoader and samplers): the correct ones must pass, with a warning where a generator
differs that no step draws from; the one whose next epoch shuffles otherwise must fail, naming
its generator (issue #45)."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler

SAMPLES = 24  # three batches of 8: an epoch is three steps
BATCH = 8


class _Linear:
    """A linear regression over SAMPLES fixed rows; ``step`` trains on the rows a batch names."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Linear(4, 1).double()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.data = torch.randn(SAMPLES * 2, 4, dtype=torch.float64)

    def model_state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_model_state(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])

    def train_on(self, rows: Any) -> float:
        loss = self.model(self.data[rows]).square().mean()
        self.optimizer.zero_grad()
        loss.backward()
        if dist.is_initialized() and dist.get_world_size() > 1:
            for p in self.model.parameters():
                assert p.grad is not None
                dist.all_reduce(p.grad)
        self.optimizer.step()
        return float(loss)


class StatefulLoop(_Linear):
    """torchdata's StatefulDataLoader with a seeded sampler (``g1``) and a loader generator
    (``g2``), its state in ``state_dict()``. Each new iterator draws a worker base seed from
    ``g2``, which a map-style dataset never reads: correct."""

    def __init__(self, num_workers: int = 0) -> None:
        from torchdata.stateful_dataloader import StatefulDataLoader

        super().__init__()
        ids = list(range(SAMPLES))
        self.g1 = torch.Generator().manual_seed(1)
        self.g2 = torch.Generator().manual_seed(2)
        extra = {"persistent_workers": True} if num_workers else {}
        self.loader = StatefulDataLoader(
            ids,
            batch_size=BATCH,
            sampler=RandomSampler(ids, generator=self.g1),
            generator=self.g2,
            num_workers=num_workers,
            **extra,
        )
        self.batches: Any = None

    def state_dict(self) -> dict[str, Any]:
        return {**self.model_state(), "loader": self.loader.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_model_state(state)
        self.loader.load_state_dict(state["loader"])
        self.batches = None

    def step(self) -> float:
        if self.batches is None:
            self.batches = iter(self.loader)
        batch = next(self.batches, None)
        if batch is None:  # the epoch is over: the next one
            self.batches = iter(self.loader)
            batch = next(self.batches)
        return self.train_on(batch)


class EpochShuffle(_Linear):
    """Shuffles each epoch of twice SAMPLES rows (six steps) with ``torch.randperm`` drawn from its
    own generator as the epoch's first step begins, and saves the epoch's order and position,
    but not the generator (``save_generator``): a resume mid-epoch matches step by step, its
    generator has drawn nothing, and the next epoch's order then differs. Correct when it
    saves the generator."""

    def __init__(self, save_generator: bool) -> None:
        super().__init__()
        self.gen = torch.Generator().manual_seed(3)
        self.save_generator = save_generator
        # Drawn as the first step begins; DCP loads into a tensor of the saved size.
        self.order = torch.arange(SAMPLES * 2)
        self.position = len(self.order)

    def state_dict(self) -> dict[str, Any]:
        state = {**self.model_state(), "order": self.order, "position": self.position}
        return {**state, "gen": self.gen.get_state()} if self.save_generator else state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_model_state(state)
        self.order, self.position = state["order"].clone(), state["position"]
        if self.save_generator:
            self.gen.set_state(state["gen"])

    def step(self) -> float:
        if self.position == len(self.order):
            self.order, self.position = torch.randperm(SAMPLES * 2, generator=self.gen), 0
        rows = self.order[self.position : self.position + BATCH]
        self.position += BATCH
        return self.train_on(rows)


class DistributedEpochs(_Linear):
    """torch's DataLoader over a DistributedSampler, with ``set_epoch`` at each epoch and the
    epoch and position in ``state_dict()``: the documented pattern, correct. The resumed run
    skips the batches its epoch already took."""

    def __init__(self) -> None:
        super().__init__()
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        ids = list(range(SAMPLES))
        self.sampler = DistributedSampler(ids, num_replicas=world, rank=rank, seed=5)
        self.loader = DataLoader(ids, batch_size=BATCH // world, sampler=self.sampler)
        self.epoch, self.position = 0, 0
        self.batches: Any = None

    def state_dict(self) -> dict[str, Any]:
        return {**self.model_state(), "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_model_state(state)
        self.epoch, self.position, self.batches = state["epoch"], state["position"], None

    def step(self) -> float:
        if self.batches is None:
            self.sampler.set_epoch(self.epoch)
            self.batches = iter(self.loader)
            for _ in range(self.position):
                next(self.batches)
        batch = next(self.batches, None)
        if batch is None:
            self.epoch, self.position = self.epoch + 1, 0
            self.sampler.set_epoch(self.epoch)
            self.batches = iter(self.loader)
            batch = next(self.batches)
        self.position += 1
        return self.train_on(batch)


class LoaderGenerator(_Linear):
    """torch's DataLoader with ``shuffle=True`` and ``generator=``: the sampler shuffles from
    that generator at each epoch, so its state is saved beside the position, as the loop
    rebuilds the epoch's order from it (correct)."""

    def __init__(self) -> None:
        super().__init__()
        self.gen = torch.Generator().manual_seed(7)
        ids = list(range(SAMPLES))
        self.loader = DataLoader(ids, batch_size=BATCH, shuffle=True, generator=self.gen)
        self.epoch_start = self.gen.get_state()
        self.position = 0
        self.batches: Any = None

    def state_dict(self) -> dict[str, Any]:
        return {**self.model_state(), "epoch_start": self.epoch_start, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_model_state(state)
        self.epoch_start, self.position, self.batches = (
            state["epoch_start"],
            state["position"],
            None,
        )

    def step(self) -> float:
        if self.batches is None:
            self.gen.set_state(self.epoch_start)
            self.batches = iter(self.loader)
            for _ in range(self.position):
                next(self.batches)
        batch = next(self.batches, None)
        if batch is None:
            self.epoch_start, self.position = self.gen.get_state(), 0
            self.batches = iter(self.loader)
            batch = next(self.batches)
        self.position += 1
        return self.train_on(batch)


class _Stream(IterableDataset):  # type: ignore[misc]  # torch is Any to mypy (pyproject.toml)
    """An endless stream of row indices drawn from its own generator."""

    def __init__(self) -> None:
        self.gen = torch.Generator().manual_seed(11)

    def __iter__(self) -> Any:
        while True:
            yield int(torch.randint(SAMPLES * 2, (), generator=self.gen))


class Streaming(_Linear):
    """torch's DataLoader over an IterableDataset that draws from its own generator, whose
    state is saved: correct. The loader's iterator is made once."""

    def __init__(self) -> None:
        super().__init__()
        self.stream = _Stream()
        self.batches = iter(DataLoader(self.stream, batch_size=BATCH))

    def state_dict(self) -> dict[str, Any]:
        return {**self.model_state(), "stream": self.stream.gen.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.load_model_state(state)
        self.stream.gen.set_state(state["stream"])
        self.batches = iter(DataLoader(self.stream, batch_size=BATCH))

    def step(self) -> float:
        return self.train_on(next(self.batches))


def stateful_loader(rank: int, world_size: int) -> StatefulLoop:
    return StatefulLoop()


def stateful_loader_workers(rank: int, world_size: int) -> StatefulLoop:
    return StatefulLoop(num_workers=2)


def epoch_shuffle(rank: int, world_size: int) -> EpochShuffle:
    return EpochShuffle(save_generator=True)


def epoch_shuffle_generator_unsaved(rank: int, world_size: int) -> EpochShuffle:
    return EpochShuffle(save_generator=False)


def distributed_epochs(rank: int, world_size: int) -> DistributedEpochs:
    return DistributedEpochs()


def loader_generator(rank: int, world_size: int) -> LoaderGenerator:
    return LoaderGenerator()


def streaming(rank: int, world_size: int) -> Streaming:
    return Streaming()
