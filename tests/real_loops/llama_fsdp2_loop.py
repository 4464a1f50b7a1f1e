"""An FSDP2 loop the way torchtitan writes one: a tiny ``transformers`` Llama with
``fully_shard`` on each decoder layer and then the root, over a 1-D CPU mesh; model and optimizer
state through ``get_state_dict`` / ``set_state_dict`` (Shard(0) DTensors that DCP reshards); and
one ``StatefulDataLoader`` per rank over that rank's documents, packed into fixed-length samples.

Each rank's loader is at its own place in its own documents (the packing leaves a different
remainder in each rank's token buffer), so its state is saved under a key of its own,
``{"data": {f"rank_{rank}": loader.state_dict()}}``, as torchtitan keys its dataloader by
dp_rank (pytorch/torchtitan PR #279). That state does not reshard: at another world size the
ranks read other documents, and a load finds keys missing or leaves saved ones unread
(pytorch/torchtitan #811; PR #816 makes a changed dp degree an error). A run that reshards must
declare it ``--rank-local data``.

The loader has no worker processes: with workers, the base seed each ``iter()`` draws from the
global RNG would be part of its state, and this loop would have to save that RNG too (as
``llama_ddp_loop`` does).

``fixture(rank, world_size, bug=None)``; ``--fixture-arg bug=...`` selects the variant:

- ``bug="loader_not_rank_keyed"``: the loader state is saved under one key, ``{"data":
  loader.state_dict()}``, as torchtitan did before PR #279 (pytorch/torchtitan #291: "if it is
  not DTensor, only rank 0's value is saved"). Every rank's state is a different value under the
  same key; DCP treats it as replicated and keeps one rank's copy, so at world size 2 the other
  rank resumes from that rank's place in its documents (correct at world size 1).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import tiny_llama
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torchdata.stateful_dataloader import StatefulDataLoader

DOCUMENTS = 96
BATCH = 2  # samples per rank and step
BUGS = (None, "loader_not_rank_keyed")


class PackedDocuments(torch.utils.data.IterableDataset):  # type: ignore[misc]
    """Endless samples of SEQ_LEN + 1 tokens cut from the documents laid end to end, like
    torchtitan's HuggingFaceDataset; its state is torchtitan's too (the next document and the
    tokens left over), saved by ``StatefulDataLoader`` through ``state_dict`` / ``load_state_dict``."""

    def __init__(self, documents: list[list[int]]) -> None:
        self.documents = documents
        self.next_document = 0
        self.buffer: list[int] = []

    def __iter__(self) -> Iterator[torch.Tensor]:
        width = tiny_llama.SEQ_LEN + 1
        while True:
            while len(self.buffer) < width:
                self.buffer.extend(self.documents[self.next_document % len(self.documents)])
                self.next_document += 1
            sample, self.buffer = self.buffer[:width], self.buffer[width:]
            yield torch.tensor(sample)

    def state_dict(self) -> dict[str, Any]:
        return {"next_document": self.next_document, "buffer": list(self.buffer)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.next_document = int(state_dict["next_document"])
        self.buffer = list(state_dict["buffer"])


class LlamaFsdp2:
    def __init__(self, rank: int, world_size: int, bug: str | None) -> None:
        if bug not in BUGS:
            raise ValueError(f"bug {bug!r} is not a variant of this loop")
        self.rank, self.world_size, self.bug = rank, world_size, bug
        self.model = tiny_llama.build_model()  # the same full weights everywhere, then sharded
        mesh = init_device_mesh("cpu", (world_size,))
        for layer in self.model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self.model, mesh=mesh)
        self.optimizer, self.scheduler = tiny_llama.build_optimizer(self.model.parameters())
        # This rank's share of the documents, as split_dataset_by_node gives it.
        documents = tiny_llama.documents(DOCUMENTS)[rank::world_size]
        self.loader = StatefulDataLoader(PackedDocuments(documents), batch_size=BATCH)
        self.batches: Iterator[torch.Tensor] | None = None

    def state_dict(self) -> dict[str, Any]:
        model, optim = get_state_dict(self.model, self.optimizer)
        data = self.loader.state_dict()
        if self.bug != "loader_not_rank_keyed":
            data = {f"rank_{self.rank}": data}
        return {"model": model, "optim": optim, "sched": self.scheduler.state_dict(), "data": data}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )
        self.scheduler.load_state_dict(state_dict["sched"])
        data = state_dict["data"]
        if self.bug != "loader_not_rank_keyed":
            data = data[f"rank_{self.rank}"]
        self.loader.load_state_dict(data)
        self.batches = None  # the loaded state applies at the next iter()

    def step(self) -> float:
        if self.batches is None:
            self.batches = iter(self.loader)
        loss = tiny_llama.causal_lm_loss(self.model, next(self.batches))
        self.optimizer.zero_grad()
        loss.backward()  # FSDP reduce-scatters and averages the gradients
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), tiny_llama.MAX_GRAD_NORM)
        self.optimizer.step()
        self.scheduler.step()
        total = loss.detach()
        dist.all_reduce(total)
        return float(total) / self.world_size


def fixture(rank: int, world_size: int, bug: str | None = None) -> LlamaFsdp2:
    return LlamaFsdp2(rank, world_size, bug)
