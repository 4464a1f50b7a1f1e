"""Loops that write and read their own checkpoints, as a framework's ``save_state`` does: the
tool calls ``save(dir)`` and ``load(dir)`` and never DCP.

Each rank writes its whole state with ``torch.save`` into a file of its own and reads it back
with ``torch.load(weights_only=True)``. Workers import this module by name
(``saving_loops:NAME``); it builds on :mod:`fixture_loops`' correct loop.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from typing import Any

import torch
from fixture_loops import Correct


class SavesItself(Correct):
    """The correct loop, checkpointed by its own code; ``state_dict()`` stays, so the tool also
    compares the state it loaded with the state it saved, without DCP in between."""

    def path(self, checkpoint_dir: str) -> str:
        return os.path.join(checkpoint_dir, f"rank{self.rank}.pt")

    def save(self, checkpoint_dir: str) -> None:
        state = {
            "model": self.model.state_dict(),
            "optim": self.optimizer.state_dict(),
            **self.loop_state(),
        }
        torch.save(state, self.path(checkpoint_dir))

    def load(self, checkpoint_dir: str) -> None:
        state = torch.load(self.path(checkpoint_dir), weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optim"])
        self.restore_loop_state(state)

    def restore_loop_state(self, state: dict[str, Any]) -> None:
        self.load_loop_state(state)


class SchedulerNotRestored(SavesItself):
    """Saves the LR scheduler and never restores it, as Lightning Fabric 2.6.6's
    ModelParallelStrategy load does to a Stateful scheduler (``state[key] = metadata.pop(key)``
    in lightning/fabric/strategies/model_parallel.py): the warmup restarts after a resume."""

    def restore_loop_state(self, state: dict[str, Any]) -> None:
        super().restore_loop_state({**state, "sched": self.scheduler.state_dict()})


class Opaque:
    """A loop that saves itself and shows the tool no state: only its losses can be compared."""

    def __init__(self, app: SavesItself) -> None:
        self.app = app

    def save(self, checkpoint_dir: str) -> None:
        self.app.save(checkpoint_dir)

    def load(self, checkpoint_dir: str) -> None:
        self.app.load(checkpoint_dir)

    def step(self) -> float:
        return self.app.step()


class LoadsTheWrongFile(SavesItself):
    """Looks for its checkpoint under another name than it saved it: its load raises."""

    def load(self, checkpoint_dir: str) -> None:
        torch.load(os.path.join(checkpoint_dir, "latest.pt"), weights_only=True)


class StartsAfreshOnABadFile(SavesItself):
    """Starts afresh when its file cannot be read, as loops that take a missing or unreadable
    checkpoint for "no checkpoint yet" do: after a crash mid-save it trains on from step 0."""

    def load(self, checkpoint_dir: str) -> None:
        try:
            super().load(checkpoint_dir)
        except (OSError, RuntimeError, EOFError):
            return  # the bug: a checkpoint cut short is taken for none


class DiesInsideSave(SavesItself):
    """Rank 1 is killed inside its save, half of its file written, as a node lost mid-save is."""

    def save(self, checkpoint_dir: str) -> None:
        if self.rank != 1:
            super().save(checkpoint_dir)
            return
        with open(self.path(checkpoint_dir), "wb") as f:
            f.write(b"half a checkpoint")
        os._exit(DIES_INSIDE_SAVE)


# The exit code of the rank DiesInsideSave kills.
DIES_INSIDE_SAVE = 87


class SavesATree(SavesItself):
    """Saves as frameworks do, into subdirectories (Accelerate's sharded FSDP ``save_state``
    writes ``pytorch_model_fsdp_0/`` and ``optimizer_0/``; DeepSpeed ``global_step<N>/``): the
    model and the optimizer with the loop's state each in a directory of their own, one file
    per rank, and a ``logs/`` directory it leaves empty and its load expects."""

    def save(self, checkpoint_dir: str) -> None:
        for sub in ("model", "optim", "logs"):
            os.makedirs(os.path.join(checkpoint_dir, sub), exist_ok=True)  # every rank: no race
        torch.save(self.model.state_dict(), self.part(checkpoint_dir, "model"))
        state = {"optim": self.optimizer.state_dict(), **self.loop_state()}
        torch.save(state, self.part(checkpoint_dir, "optim"))

    def load(self, checkpoint_dir: str) -> None:
        if not os.path.isdir(os.path.join(checkpoint_dir, "logs")):
            raise FileNotFoundError("the checkpoint has no logs/ directory")
        self.model.load_state_dict(
            torch.load(self.part(checkpoint_dir, "model"), weights_only=True)
        )
        self.load_optimizer(checkpoint_dir)

    def load_optimizer(self, checkpoint_dir: str) -> None:
        state = torch.load(self.part(checkpoint_dir, "optim"), weights_only=True)
        self.optimizer.load_state_dict(state["optim"])
        self.load_loop_state(state)

    def part(self, checkpoint_dir: str, sub: str) -> str:
        return os.path.join(checkpoint_dir, sub, f"rank{self.rank}.pt")


class IgnoresTheOptimizerDirectory(SavesATree):
    """Saves the tree and loads only its model/: the optimizer, the schedule and the data
    position in optim/ start afresh after a resume."""

    def load_optimizer(self, checkpoint_dir: str) -> None:
        pass


# Past the depth a receipt holds (dcp_invariant.commit.receipt.MAX_DEPTH, 16 levels).
TOO_DEEP = [f"d{level}" for level in range(17)]


class NestsTooDeep(SavesItself):
    """Saves 17 directories deep, which the commit protocol refuses to seal."""

    def path(self, checkpoint_dir: str) -> str:
        os.makedirs(os.path.join(checkpoint_dir, *TOO_DEEP), exist_ok=True)
        return os.path.join(checkpoint_dir, *TOO_DEEP, f"rank{self.rank}.pt")


class SavesOnly(Correct):
    """Has save() but no load(): half of the own-checkpointing shape."""

    def save(self, checkpoint_dir: str) -> None:
        torch.save(self.model.state_dict(), os.path.join(checkpoint_dir, "model.pt"))


class Reshards(SavesItself):
    """Declares that its load() takes a save made at another world size, and keeps that
    promise: its state is the same on every rank, so rank 0 writes it once and every rank
    reads that one file."""

    reshards = True

    def path(self, checkpoint_dir: str) -> str:
        return os.path.join(checkpoint_dir, "state.pt")

    def save(self, checkpoint_dir: str) -> None:
        if self.rank == 0:
            super().save(checkpoint_dir)


class ReshardsPerRank(SavesItself):
    """Declares that it reshards, yet each rank reads the file its own rank wrote: at a larger
    world size the new ranks find none."""

    reshards = True


class SavesAsync(SavesItself):
    """Saves in the background, as an async checkpointer does: save() copies the state, starts
    a thread that writes the copy, and returns the write's future."""

    saves_async = True

    def save(self, checkpoint_dir: str) -> Future[None]:  # type: ignore[override]
        state = _cloned(self.whole_state())
        done: Future[None] = Future()

        def write() -> None:
            try:
                torch.save(state, self.path(checkpoint_dir))
            except BaseException as exc:  # handed to whoever waits, as an executor does
                done.set_exception(exc)
            else:
                done.set_result(None)

        threading.Thread(target=write, daemon=True).start()
        return done

    def whole_state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optim": self.optimizer.state_dict(),
            **self.loop_state(),
        }


class WritesWhenWaitedFor(SavesAsync):
    """Returns a future that reads the state only when it is waited for: the live tensors,
    which the step after the save has changed by then."""

    def save(self, checkpoint_dir: str) -> Future[None]:  # type: ignore[override]
        app = self

        class Late(Future[None]):
            def result(self, timeout: float | None = None) -> None:
                torch.save(app.whole_state(), app.path(checkpoint_dir))

        return Late()


class ReshardsAndSavesAsync(SavesAsync):
    """Declares both, and keeps both: rank 0 writes the one file in the background, which every
    rank reads at any world size."""

    reshards = True

    def path(self, checkpoint_dir: str) -> str:
        return os.path.join(checkpoint_dir, "state.pt")

    def save(self, checkpoint_dir: str) -> Future[None]:  # type: ignore[override]
        if self.rank == 0:
            return super().save(checkpoint_dir)
        nothing: Future[None] = Future()
        nothing.set_result(None)
        return nothing


class SavesAsyncSchedulerNotRestored(SavesAsync, SchedulerNotRestored):
    """Saves in the background and never restores its scheduler."""


class UndeclaredFuture(SavesAsync):
    """Returns its write's future without declaring saves_async."""

    saves_async = False


def _cloned(state: Any) -> Any:
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, dict):
        return {k: _cloned(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_cloned(v) for v in state]
    return state


# -- entry points ----------------------------------------------------------------------------------


def saves_itself(rank: int, world_size: int) -> SavesItself:
    return SavesItself(rank, world_size)


def scheduler_not_restored(rank: int, world_size: int) -> SavesItself:
    return SchedulerNotRestored(rank, world_size)


def opaque(rank: int, world_size: int) -> Opaque:
    return Opaque(SavesItself(rank, world_size))


def opaque_scheduler_not_restored(rank: int, world_size: int) -> Opaque:
    return Opaque(SchedulerNotRestored(rank, world_size))


def loads_the_wrong_file(rank: int, world_size: int) -> SavesItself:
    return LoadsTheWrongFile(rank, world_size)


def starts_afresh_on_a_bad_file(rank: int, world_size: int) -> SavesItself:
    return StartsAfreshOnABadFile(rank, world_size)


def dies_inside_save(rank: int, world_size: int) -> SavesItself:
    return DiesInsideSave(rank, world_size)


def saves_a_tree(rank: int, world_size: int) -> SavesATree:
    return SavesATree(rank, world_size)


def ignores_the_optimizer_directory(rank: int, world_size: int) -> SavesATree:
    return IgnoresTheOptimizerDirectory(rank, world_size)


def nests_too_deep(rank: int, world_size: int) -> SavesItself:
    return NestsTooDeep(rank, world_size)


def saves_only(rank: int, world_size: int) -> SavesOnly:
    return SavesOnly(rank, world_size)


def reshards(rank: int, world_size: int) -> SavesItself:
    return Reshards(rank, world_size)


def reshards_per_rank(rank: int, world_size: int) -> SavesItself:
    return ReshardsPerRank(rank, world_size)


def saves_async(rank: int, world_size: int) -> SavesItself:
    return SavesAsync(rank, world_size)


def writes_when_waited_for(rank: int, world_size: int) -> SavesItself:
    return WritesWhenWaitedFor(rank, world_size)


def undeclared_future(rank: int, world_size: int) -> SavesItself:
    return UndeclaredFuture(rank, world_size)


def saves_async_scheduler_not_restored(rank: int, world_size: int) -> SavesItself:
    return SavesAsyncSchedulerNotRestored(rank, world_size)


def reshards_and_saves_async(rank: int, world_size: int) -> SavesItself:
    return ReshardsAndSavesAsync(rank, world_size)
