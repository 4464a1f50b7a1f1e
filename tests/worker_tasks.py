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


def hang_with_a_child(
    rank: int, world_size: int, payload: dict[str, Any], report: Reporter
) -> None:
    """Fork a child that inherits every descriptor and outlives the rank, then hang: what a
    DataLoader's forked workers do to a rank that is killed at its deadline."""
    import os
    import sys
    import time

    report({"rank": rank, "pid": os.getpid()})
    if sys.platform != "win32" and os.fork() == 0:
        time.sleep(600)
        os._exit(0)
    time.sleep(600)
