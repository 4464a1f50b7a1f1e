"""Loops for the cross-release live tests (tests/suite/test_cross_release_live.py), imported by
ranks of two torch releases: self-contained, so the other release's ranks find them with the
test directory alone on their path."""

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

# The release from which this loop names its model's state otherwise: a synthetic rename, as a
# library that renames a key between releases does (no type of torch's own changed between the
# registered releases in what this loop saves).
RENAMED_FROM = (2, 15)


def _release() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


class RenamedByRelease:
    """A correct loop on any one release, whose model key is ``model`` before 2.15 and ``net``
    from 2.15 on: a checkpoint saved on one side does not load on the other."""

    def __init__(self, rank: int, world_size: int) -> None:
        data = torch.Generator().manual_seed(0)
        self.x = torch.randn(4, 8, 8, generator=data, dtype=torch.float64)
        self.y = self.x.sum(-1, keepdim=True)
        self.world_size, self.cursor = world_size, 0
        torch.manual_seed(0)
        self.model = torch.nn.Linear(8, 1).double()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.key = "net" if _release() >= RENAMED_FROM else "model"

    def state_dict(self) -> dict[str, Any]:
        model, optim = get_state_dict(self.model, self.optimizer)
        return {self.key: model, "optim": optim, "cursor": self.cursor}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        set_state_dict(
            self.model, self.optimizer, model_state_dict=sd[self.key], optim_state_dict=sd["optim"]
        )
        self.cursor = sd["cursor"]

    def step(self) -> float:
        x, y = self.x[self.cursor % 4], self.y[self.cursor % 4]
        self.cursor += 1
        loss = (self.model(x) - y).square().mean()
        self.optimizer.zero_grad()
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= self.world_size
        self.optimizer.step()
        dist.all_reduce(total := loss.detach())
        return float(total) / self.world_size


def renamed_by_release(rank: int, world_size: int) -> RenamedByRelease:
    return RenamedByRelease(rank, world_size)
