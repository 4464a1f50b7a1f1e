"""Broken variants of the registered training fixture, one bug each, for the negative live tests.

Workers import this module by name (``fixture_variants:...``): pytest puts tests/ on sys.path
and the fork server inherits it.
"""

from __future__ import annotations

from typing import Any

import torch

from dcp_invariant.suite.registered_fixture import TrainingApp


class RngNotRestored(TrainingApp):
    """Forgets the generator on load (huggingface/transformers #17032)."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved = self.generator.get_state()
        super().load_state_dict(state_dict)
        self.generator.set_state(saved)


class CursorNotRestored(TrainingApp):
    """Restarts the data stream from the beginning (pytorch/pytorch #36650)."""

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.cursor = 0


class NaiveOptimizerState(TrainingApp):
    """Hands DCP a fresh optimizer's own state_dict(): its empty state silently drops momentum."""

    def state_dict(self) -> dict[str, Any]:
        # No get_state_dict: it would initialise the optimizer state and hide the bug.
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": {"generator": self.generator.get_state()},
            "cursor": {"step": torch.tensor(self.cursor, dtype=torch.int64)},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.model.load_state_dict(state_dict["model"])
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.generator.set_state(state_dict["rng"]["generator"])
        self.cursor = int(state_dict["cursor"]["step"])


def rng_not_restored(rank: int, world_size: int) -> TrainingApp:
    return RngNotRestored(rank, world_size)


def cursor_not_restored(rank: int, world_size: int) -> TrainingApp:
    return CursorNotRestored(rank, world_size)


def naive_optimizer_state(rank: int, world_size: int) -> TrainingApp:
    return NaiveOptimizerState(rank, world_size)
