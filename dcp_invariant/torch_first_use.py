"""What torch 2.13 imports lazily on a process's first optimizer step, DCP save and DTensor op
(torch._dynamo alone is about 0.8-1 s here): a server that forks processes running torch code
imports these before its first fork, so that no forked process pays for them. A module missing
from another torch release is skipped. Torch-free: a list of names."""

from __future__ import annotations

from typing import Final

MODULES: Final = (
    "numpy.random",
    "torch._dynamo",
    "torch.distributed.checkpoint._fsspec_filesystem",
    "torch.profiler._cupti_monitor",
    "torch.utils.serialization",
)
