"""A Lightning Fabric loop checkpointed with fabric.save and fabric.load: FSDP2 through
ModelParallelStrategy, AdamW, a warmup schedule, and a data position with the generator that
shuffles the data and draws dropout."""

import torch
import torch.distributed as dist
from lightning.fabric.strategies import ModelParallelStrategy
from torch.distributed.fsdp import fully_shard

from dcp_invariant.adapters import fabric as fabric_adapter


class Position:  # stateful, so fabric.save saves it with the model and optimizer
    def __init__(self):
        self.gen, self.cursor = torch.Generator().manual_seed(1), 0

    def state_dict(self):
        return {"rng": self.gen.get_state(), "cursor": self.cursor}

    def load_state_dict(self, sd):
        self.gen.set_state(sd["rng"])
        self.cursor = sd["cursor"]


def shard(model, mesh):
    for layer in (model[0], model[2], model):
        fully_shard(layer, mesh=mesh["data_parallel"])
    return model


def build(make_fabric):
    # Data parallel only: ModelParallelStrategy's "auto" sizes make the ranks tensor-parallel.
    ranks = dist.get_world_size()
    strategy = ModelParallelStrategy(shard, data_parallel_size=ranks, tensor_parallel_size=1)
    fabric = make_fabric(strategy=strategy, precision="32-true")
    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(0))
    y = x.cos().mean(-1, keepdim=True)
    torch.manual_seed(0)  # initial weights only
    model = fabric.setup_module(
        torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    )
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=0.01))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / 4))
    position = Position()
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "position": position}
    n = 8 // fabric.world_size
    rows = slice(fabric.global_rank * n, fabric.global_rank * n + n)  # this rank's share

    def step():
        batch = torch.randperm(64, generator=position.gen)[:8]  # this step's global batch
        keep = torch.rand(8, 16, generator=position.gen) >= 0.1  # dropout on the inputs
        position.cursor += 1
        loss = (model((x[batch] * keep / 0.9)[rows]) - y[batch][rows]).square().mean()
        optimizer.zero_grad()
        fabric.backward(loss)
        optimizer.step()
        scheduler.step()
        return float(fabric.all_reduce(loss.detach(), reduce_op="mean"))

    return fabric, state, step


def load(fabric, path, state):
    # Under ModelParallelStrategy, fabric.load puts the raw state dict it read in place of each
    # stateful object (Lightning 2.6.6): restore each one and put it back.
    objects = {key: state[key] for key in ("scheduler", "position")}
    fabric.load(path, state)
    for key, obj in objects.items():
        obj.load_state_dict(state[key])
        state[key] = obj


def fixture(rank, world_size):
    # ModelParallelStrategy saves a sharded checkpoint through DCP, which loads at another
    # world size: declared, the tool checks that too (reshard_<a>_to_<b>).
    return fabric_adapter.app(build, load=load, reshards=True)
