"""A loop's DataLoader workers inside a tool worker start as they would in the user's own script.

A worker started by a ``forkserver`` (or ``spawn``) context inherits that start method as its
default (multiprocessing/process.py, ``BaseProcess._bootstrap``), and a DataLoader without a
``multiprocessing_context`` takes the default (torch/utils/data/dataloader.py): each worker
then started a fork server of its own, with none of torch preloaded, and every DataLoader worker
imported torch anew. :func:`dcp_invariant.suite.worker.use_platform_start_method` undoes that.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dcp_invariant.suite import pool, workspace
from dcp_invariant.suite.scenarios.payloads import Call
from dcp_invariant.suite.worker import Reporter

pytestmark = pytest.mark.live


class _Parents:
    """A map-style dataset (torch is imported only in workers: this module is collected without
    it); each item is the PID of the process that made it and of that process's parent."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[int, int]:
        return os.getpid(), os.getppid()


def loader_workers(rank: int, world_size: int, payload: dict[str, Any], report: Reporter) -> None:
    """A task: iterate a two-worker loader once; say where its workers ran and who started them."""
    if payload["loader"] == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader as Loader
    else:
        from torch.utils.data import DataLoader as Loader
    # No multiprocessing_context: the loader takes multiprocessing's default, as most loops do.
    loader: Any = Loader(_Parents(), batch_size=1, num_workers=2)
    pairs = {(int(pid), int(parent)) for pid, parent in loader}
    report(
        {
            "start_method": multiprocessing.get_start_method(),
            "pid": os.getpid(),
            "loader_workers": sorted({pid for pid, _ in pairs}),
            "their_parents": sorted({parent for _, parent in pairs}),
        }
    )


def _platform_default() -> str:
    """The default start method of a script run on its own, in a fresh interpreter."""
    code = "import multiprocessing; print(multiprocessing.get_start_method())"
    return subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60
    ).stdout.strip()


@pytest.mark.parametrize("loader", ["torch", "stateful"])
@pytest.mark.parametrize("method", pool.available_start_methods())
def test_loader_workers_use_the_platform_start_method(
    method: str, loader: str, tmp_path: Path
) -> None:
    if loader == "stateful":
        pytest.importorskip("torchdata.stateful_dataloader")
    expected = _platform_default()
    # As a run does: the workspace first, so multiprocessing's sockets go where they fit even
    # under a deep TMPDIR (workspace._short_socket_directory), in this process for good.
    with workspace.Workspace() as space:
        workers = pool.WorkerPool(timeout=120, method=method)
        workers.start(space / "server")
        try:
            outcome = workers.run_group(
                Call(f"{__name__}:loader_workers", {"loader": loader}), 1, tmp_path, "loader"
            )
        finally:
            workers.close()
    assert outcome.ok, outcome.log_tail()
    [record] = outcome.results
    assert record["start_method"] == expected
    assert len(record["loader_workers"]) == 2
    assert record["pid"] not in record["loader_workers"]  # num_workers=2 ran in processes
    if expected != "forkserver":
        # fork and spawn start a DataLoader worker as the loop's own child; a fork server of
        # the worker's own would stand between them, and be left running when the task ended.
        assert record["their_parents"] == [record["pid"]]
        assert outcome.stragglers == []
