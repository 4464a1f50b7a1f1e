"""The async save's own process group (ranks/fixture_tasks.py ``_checkpoint_group``), with two
real Gloo ranks. It is made under a fifth of the run's timeout, so that Gloo's first connection
(whose listening side waits five times the group's timeout) gives up within the run's timeout
when a peer is lost; its collectives must then still wait the run's whole timeout for a slow
peer. Which side listens is decided by the two ports Gloo draws (``Device::isInitiator``), so a
peer lost in the middle of the connection cannot be staged on purpose; a peer lost before the
group is made can."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dcp_invariant.suite.worker import loopback_interface

pytestmark = pytest.mark.live

TIMEOUT = 30.0  # the run's timeout: the group is made under 6 s of it
LATE = 9.0  # how late rank 1 comes to the group's first collective: past 6 s, within 30 s

_RANK = """
import sys, time
from datetime import timedelta
import torch, torch.distributed as dist
from dcp_invariant.ranks.fixture_tasks import _checkpoint_group
from dcp_invariant.suite.worker import loopback_gloo_options
rank, store_path, timeout, late, leave = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:6])
rank = int(rank)
store = dist.FileStore(store_path, 2)
dist.init_process_group(
    "gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=timeout),
    pg_options=loopback_gloo_options(),
)
if rank == 1 and leave:
    sys.exit(0)  # the peer lost before the save
started = time.monotonic()
try:
    group = _checkpoint_group(timeout)
    if rank == 1:
        time.sleep(late)
    total = torch.ones(1)
    dist.all_reduce(total, group=group)
    print("sum", int(total.item()), flush=True)
except RuntimeError as exc:
    print("failed", type(exc).__name__, flush=True)
print("took", time.monotonic() - started, flush=True)
"""


def _ranks(tmp_path: Path, *, late: float, leave: bool) -> list[str]:
    store = tmp_path / "store"
    # Gloo binds the interface this names (it does not take pg_options: worker.py says why).
    interface = loopback_interface()
    env = {**os.environ, **({"GLOO_SOCKET_IFNAME": interface} if interface else {})}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, str(rank), str(store), str(TIMEOUT), str(late), str(int(leave))],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=tmp_path,
            env=env,
        )
        for rank in (0, 1)
    ]  # fmt: skip
    try:
        return [proc.communicate(timeout=TIMEOUT * 4)[0] for proc in procs]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def _took(out: str) -> float:
    return float(out.rsplit("took ", 1)[1].split()[0])


def test_the_groups_collectives_wait_the_runs_whole_timeout_for_a_late_peer(
    tmp_path: Path,
) -> None:
    first, second = _ranks(tmp_path, late=LATE, leave=False)
    assert "sum 2" in first and "sum 2" in second, (first, second)
    assert _took(first) >= LATE, first  # it did wait for rank 1, longer than the group was made in


def test_a_peer_lost_before_the_group_is_made_fails_the_survivor_within_the_runs_timeout(
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    survivor, _ = _ranks(tmp_path, late=0, leave=True)
    assert "failed" in survivor and "sum" not in survivor, survivor
    assert _took(survivor) < TIMEOUT + 5, survivor
    assert time.monotonic() - started < TIMEOUT * 2
