"""An Accelerate loop checkpointed with accelerator.save_state and load_state: an MLP with
dropout, AdamW, a warmup schedule, and a shuffled DataLoader that Accelerate shards across the
ranks; the data position is an object registered for checkpointing."""

import torch
from accelerate.utils import DataLoaderConfiguration, set_seed
from torch.utils.data import DataLoader, TensorDataset

from dcp_invariant.adapters import accelerate as accelerate_adapter


class Position:  # save_state keeps no position in a map-style loader: the loop keeps it
    def __init__(self):
        self.epoch, self.batch = 0, 0

    def state_dict(self):
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, sd):
        self.epoch, self.batch = sd["epoch"], sd["batch"]


def build(make_accelerator):
    set_seed(0)  # Python's, NumPy's and torch's generators, which save_state saves
    # A seedable sampler: each epoch's order is a function of the epoch alone.
    config = DataLoaderConfiguration(use_seedable_sampler=True, data_seed=0)
    accelerator = make_accelerator(dataloader_config=config)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    data = TensorDataset(x, x.cos().mean(-1, keepdim=True))
    # Its own generator: the sampler's order must not hang on the global one.
    shuffle = torch.Generator().manual_seed(2)
    loader = DataLoader(data, batch_size=4, shuffle=True, generator=shuffle)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / 5))
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    position = Position()
    accelerator.register_for_checkpointing(position)
    current = {"at": None, "batches": None}  # where the iterator below stands

    def step():
        if current["at"] != (position.epoch, position.batch):  # fresh, loaded or a new epoch
            loader.set_epoch(position.epoch)
            current["batches"] = iter(loader)
            for _ in range(position.batch):  # the batches this epoch already took
                next(current["batches"])
        xb, yb = next(current["batches"])
        loss = (model(xb) - yb).square().mean()
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        position.batch += 1
        if position.batch == len(loader):
            position.epoch, position.batch = position.epoch + 1, 0
        current["at"] = (position.epoch, position.batch) if position.batch else None
        return float(accelerator.reduce(loss.detach(), reduction="mean"))

    return accelerator, step


def fixture(rank, world_size):
    return accelerate_adapter.app(build)
