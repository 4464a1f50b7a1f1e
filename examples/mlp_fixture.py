"""A correct fixture: an MLP with dropout drawn from a saved generator, SGD with momentum, a StepLR
schedule and a data cursor, all in state_dict(); gradients and the loss are all-reduced."""

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


class App:
    def __init__(self, rank, world_size, width=32, batch=16):
        data = torch.Generator().manual_seed(0)  # 8 synthetic global batches
        self.x = torch.randn(8, batch, width, generator=data, dtype=torch.float64)
        self.y = self.x.sin().mean(-1, keepdim=True)
        n, self.world_size = batch // world_size, world_size
        self.rows = slice(rank * n, rank * n + n)  # this rank's share of each batch
        torch.manual_seed(0)  # initial weights only; training draws from self.gen
        self.model = torch.nn.Sequential(
            torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
        ).double()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=2, gamma=0.5)
        self.gen, self.cursor = torch.Generator().manual_seed(1), 0

    def state_dict(self):
        model, optim = get_state_dict(self.model, self.optimizer)  # not optimizer.state_dict()
        sched, rng = self.scheduler.state_dict(), self.gen.get_state()
        return {"model": model, "optim": optim, "sched": sched, "rng": rng, "cursor": self.cursor}

    def load_state_dict(self, sd):
        set_state_dict(
            self.model, self.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"]
        )
        self.scheduler.load_state_dict(sd["sched"])
        self.gen.set_state(sd["rng"])
        self.cursor = sd["cursor"]

    def step(self):
        x, y = self.x[self.cursor % 8], self.y[self.cursor % 8]
        self.cursor += 1
        # One mask for the whole global batch: the generator advances alike on every rank.
        keep = torch.rand(x.shape, generator=self.gen, dtype=x.dtype) >= 0.1
        hidden = self.model[:2](x[self.rows]) * keep[self.rows] / 0.9  # dropout after the ReLU
        loss = (self.model[2](hidden) - y[self.rows]).square().mean()
        self.optimizer.zero_grad()
        loss.backward()
        for p in self.model.parameters():
            dist.all_reduce(p.grad)  # the sum over ranks, then the mean
            p.grad /= self.world_size
        self.optimizer.step()
        self.scheduler.step()
        dist.all_reduce(total := loss.detach())
        return float(total) / self.world_size


def fixture(rank, world_size):
    return App(rank, world_size)


def slow_fixture(rank, world_size):  # about 100 ms a step on one thread
    return App(rank, world_size, width=512, batch=2048)
