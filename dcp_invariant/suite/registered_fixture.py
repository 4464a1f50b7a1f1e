"""The registered training fixture: exact at any world size, with every state component live.

Every value is a dyadic rational small enough that each product and partial sum is exact in
float64, so splitting the global batch over 1 or 2 ranks and all-reducing the gradients gives
bit-identical parameters: a resharded resume can then be compared bit for bit.

Each component changes the next step if it is not restored: the model and optimizer
(momentum) obviously, the generator (it draws the per-step input mask) and the cursor (it
selects the batch).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

GLOBAL_BATCH = 4
SAMPLES = 16
FEATURES = 4
OUTPUTS = 2
SEED = 20261202
LR = 0.125  # 2**-3
MOMENTUM = 0.5  # 2**-1


class TrainingApp:
    def __init__(self, rank: int, world_size: int) -> None:
        if GLOBAL_BATCH % world_size:
            raise ValueError(
                f"world size {world_size} does not divide the global batch of {GLOBAL_BATCH}"
            )
        self.rank = rank
        self.world_size = world_size
        self.local_batch = GLOBAL_BATCH // world_size
        i = torch.arange(SAMPLES, dtype=torch.float64).unsqueeze(1)
        j = torch.arange(FEATURES, dtype=torch.float64).unsqueeze(0)
        # Values in {-1, -1/2, 0, 1/2, 1}: exact, and varied enough that every weight moves.
        self.inputs = torch.remainder(3 * i + 5 * j + i * j, 5) / 2 - 1
        k = torch.arange(OUTPUTS, dtype=torch.float64).unsqueeze(0)
        self.targets = torch.remainder(7 * i + 3 * k, 4) / 4 - 0.5
        self.model = torch.nn.Linear(FEATURES, OUTPUTS, dtype=torch.float64)
        with torch.no_grad():
            w = torch.arange(OUTPUTS * FEATURES, dtype=torch.float64).reshape(OUTPUTS, FEATURES)
            self.model.weight.copy_(torch.remainder(w * 3, 7) / 8 - 0.375)
            self.model.bias.copy_(torch.tensor([0.25, -0.125], dtype=torch.float64))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LR, momentum=MOMENTUM)
        self.generator = torch.Generator().manual_seed(SEED)
        self.cursor = 0

    def step(self) -> float:
        start = self.cursor * GLOBAL_BATCH + self.rank * self.local_batch
        index = torch.arange(start, start + self.local_batch) % SAMPLES
        # Every rank draws the global mask, so the generator advances identically on all ranks.
        mask = torch.randint(0, 2, (GLOBAL_BATCH, FEATURES), generator=self.generator)
        local_mask = mask[self.rank * self.local_batch : (self.rank + 1) * self.local_batch]
        x = self.inputs[index] * local_mask.to(torch.float64)
        y = self.targets[index]
        loss = ((self.model(x) - y) ** 2).sum() / GLOBAL_BATCH
        self.optimizer.zero_grad()
        loss.backward()
        total = loss.detach().clone()
        if self.world_size > 1:
            for param in self.model.parameters():
                dist.all_reduce(param.grad)
            dist.all_reduce(total)
        self.optimizer.step()
        self.cursor += 1
        return float(total)

    def state_dict(self) -> dict[str, Any]:
        # get_state_dict initialises an empty optimizer state first; loading into a fresh
        # optimizer's state_dict() would silently drop the momentum buffers.
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {
            "model": model_state,
            "optimizer": optim_state,
            "rng": {"generator": self.generator.get_state()},
            "cursor": {"step": torch.tensor(self.cursor, dtype=torch.int64)},
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optimizer"],
        )
        self.generator.set_state(state_dict["rng"]["generator"])
        self.cursor = int(state_dict["cursor"]["step"])


def registered_fixture(rank: int, world_size: int) -> TrainingApp:
    return TrainingApp(rank, world_size)
