"""Tasks for tests/suite/test_pool.py: how a worker ends, seen from outside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dcp_invariant.suite.worker import Reporter

FINALIZED = "finalized.txt"


class _Finalizer:
    """Writes a file when interpreter teardown collects it, and only then."""

    def __del__(self) -> None:
        Path(FINALIZED).write_text("torn down\n", encoding="utf-8")


_KEPT: list[_Finalizer] = []


def keep_a_finalizer(rank: int, world_size: int, payload: dict[str, Any], report: Reporter) -> None:
    _KEPT.append(_Finalizer())
    report({"rank": rank})


def exit_with(rank: int, world_size: int, payload: dict[str, Any], report: Reporter) -> None:
    import torch.distributed as dist

    # Until every rank has joined: a rank that leaves while a peer is still connecting fails
    # that peer's connection mesh ("Connection closed by peer"), which exits 1, not 7.
    dist.barrier()
    report({"rank": rank})
    raise SystemExit(payload["code"])
