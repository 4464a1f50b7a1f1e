"""Loops whose own code raises what ``except Exception`` does not catch, or leaves the process
without a word: each is named by the method it came from, with its type.

``KeyboardInterrupt``, ``SystemExit`` and ``GeneratorExit`` derive from ``BaseException``, and
so does torch's ``CheckpointException`` (torch/distributed/checkpoint/api.py), which a loop
that checkpoints itself through ``dcp.save``/``dcp.load`` meets on a checkpoint cut short.
Workers import this module by name (``raising_loops:NAME``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch.distributed.checkpoint as dcp
from fixture_loops import Correct
from saving_loops import SavesItself
from torch.distributed.checkpoint.api import CheckpointException

# What each loop raises, by the name its fixtures carry.
RAISED: dict[str, Callable[[], BaseException]] = {
    "keyboard_interrupt": KeyboardInterrupt,
    "system_exit": lambda: SystemExit(1),
    "generator_exit": GeneratorExit,
    "checkpoint_exception": lambda: CheckpointException("the loop's own", {}),
}


class RaisesAfterTheLoad(Correct):
    """The correct loop, whose ``load_state_dict`` (``where="load_state_dict"``) or first step
    after it (``where="step"``) raises."""

    def __init__(self, rank: int, world_size: int, where: str, raised: str) -> None:
        super().__init__(rank, world_size)
        self.where, self.raised, self.loaded = where, raised, False

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.where == "load_state_dict":
            raise RAISED[self.raised]()
        super().load_state_dict(state_dict)
        self.loaded = True

    def step(self) -> float:
        if self.loaded and self.where == "step":
            raise RAISED[self.raised]()
        return super().step()


class LoadRaises(SavesItself):
    """Saves itself; its ``load`` raises, whatever the checkpoint."""

    def __init__(self, rank: int, world_size: int, raised: str) -> None:
        super().__init__(rank, world_size)
        self.raised = raised

    def load(self, checkpoint_dir: str) -> None:
        raise RAISED[self.raised]()


class LeavesQuietly(Correct):
    """Its first step after the load ends the process with code 0, by ``os._exit`` or
    ``sys.exit(0)``: the rank never reports."""

    def __init__(self, rank: int, world_size: int, how: str) -> None:
        super().__init__(rank, world_size)
        self.how, self.loaded = how, False

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.loaded = True

    def step(self) -> float:
        if self.loaded:
            if self.how == "os_exit":
                os._exit(0)
            raise SystemExit(0)
        return super().step()


class DcpByItself(Correct):
    """The correct loop, checkpointed by its own ``dcp.save``/``dcp.load``, as torchtitan's
    ``CheckpointManager`` does: on a copy cut short, ``dcp.load`` raises a
    ``CheckpointException``."""

    def save(self, checkpoint_dir: str) -> None:
        dcp.save({"app": _Stateful(self)}, checkpoint_id=checkpoint_dir)

    def load(self, checkpoint_dir: str) -> None:
        dcp.load({"app": _Stateful(self)}, checkpoint_id=checkpoint_dir)


class _Stateful:
    """The loop as DCP's ``Stateful``: its own save() and load() hand DCP this view."""

    def __init__(self, loop: Correct) -> None:
        self.loop = loop

    def state_dict(self) -> dict[str, Any]:
        return Correct.state_dict(self.loop)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        Correct.load_state_dict(self.loop, state_dict)


def raises_after_the_load(rank: int, world_size: int, where: str, raised: str) -> Correct:
    return RaisesAfterTheLoad(rank, world_size, where, raised)


def load_raises(rank: int, world_size: int, raised: str) -> SavesItself:
    return LoadRaises(rank, world_size, raised)


def leaves_quietly(rank: int, world_size: int, how: str) -> Correct:
    return LeavesQuietly(rank, world_size, how)


def dcp_by_itself(rank: int, world_size: int) -> Correct:
    return DcpByItself(rank, world_size)
