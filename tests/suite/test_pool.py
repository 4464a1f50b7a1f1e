"""Worker processes as the pool starts them: forked from the server or spawned ahead.

Both paths must end a worker the same way: its exit status kept, and no interpreter teardown
(a forked worker leaves through ``os._exit``; a spawned one must too, or it pays ~1.8 s).
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_tasks import FINALIZED

from dcp_invariant.suite import pool, workspace
from dcp_invariant.suite.scenarios.payloads import Call

pytestmark = pytest.mark.live


@pytest.fixture(params=pool.available_start_methods())
def started(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[pool.WorkerPool]:
    # As a run does: the workspace first, so multiprocessing's sockets fit under a deep TMPDIR.
    with workspace.Workspace() as space:
        workers = pool.WorkerPool(timeout=120, method=request.param)
        workers.start(space / "server")
        try:
            yield workers
        finally:
            workers.close()


def test_a_worker_keeps_its_exit_status(started: pool.WorkerPool, tmp_path: Path) -> None:
    outcome = started.run_group(Call("worker_tasks:exit_with", {"code": 7}), 2, tmp_path, "exit")
    assert outcome.exit_codes == [7, 7]
    assert [r["rank"] for r in outcome.results] == [0, 1]


def test_a_worker_ends_without_interpreter_teardown(
    started: pool.WorkerPool, tmp_path: Path
) -> None:
    outcome = started.run_group(Call("worker_tasks:keep_a_finalizer", {}), 1, tmp_path, "teardown")
    assert outcome.ok, outcome.log_tail()
    assert outcome.results == [{"rank": 0}]
    assert not (tmp_path / FINALIZED).exists()


def test_once_wound_down_no_idle_standby_is_left_waiting(tmp_path: Path) -> None:
    with workspace.Workspace() as space:
        _wind_down(space, tmp_path)


def _wind_down(space: Path, tmp_path: Path) -> None:
    workers = pool.WorkerPool(timeout=120, method="spawn")
    workers.start(space / "server")
    try:
        outcome = workers.run_group(
            Call("worker_tasks:exit_with", {"code": 0}), 1, tmp_path, "before"
        )
        assert outcome.exit_codes == [0]
        waiting = len(multiprocessing.active_children())
        assert waiting >= pool.STANDBY >= 1  # kept for the next job
        workers.wind_down()
        outcome = workers.run_group(
            Call("worker_tasks:exit_with", {"code": 0}), 1, tmp_path, "after"
        )
        assert outcome.exit_codes == [0]
        assert len(multiprocessing.active_children()) == waiting - 1  # used one, started none
    finally:
        workers.close()


@pytest.fixture
def other_interpreter(tmp_path: Path) -> Iterator[pool.WorkerPool]:
    """Ranks as another environment's interpreter starts them (--resume-with-torch): here the
    runner's own, with the tests' directory for their tasks; a deadline of 8 s."""
    tests = str(Path(__file__).resolve().parents[1])
    package = str(Path(pool.__file__).resolve().parents[2])
    with workspace.Workspace() as space:
        workers = pool.WorkerPool(
            timeout=8, python=Path(sys.executable), search_path=[package, tests]
        )
        workers.start(space / "server")
        try:
            yield workers
        finally:
            workers.close()


@pytest.mark.parametrize("pidfd", [True, False], ids=["pidfd", "pipe"])
def test_another_interpreters_ranks_keep_their_exit_status(
    other_interpreter: pool.WorkerPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pidfd: bool
) -> None:
    """With a pidfd where the kernel gives one, and with the pipe used where it does not."""
    if pidfd and not pool._PIDFD:
        pytest.skip("this kernel gives no pidfd")
    monkeypatch.setattr(pool, "_PIDFD", pidfd)
    outcome = other_interpreter.run_group(
        Call("worker_tasks:exit_with", {"code": 7}), 2, tmp_path, "exit"
    )
    assert outcome.exit_codes == [7, 7]
    assert [r["rank"] for r in outcome.results] == [0, 1]


@pytest.mark.skipif(sys.platform == "win32", reason="forks a child")
def test_a_hung_rank_of_another_interpreter_is_killed_at_its_deadline_whatever_its_child_holds(
    other_interpreter: pool.WorkerPool, tmp_path: Path
) -> None:
    """The rank's child holds every descriptor the rank had: the wait for the rank's end must
    not wait for the child too (a pipe as sentinel would, forever)."""
    import time

    started = time.monotonic()
    hang = Call("worker_tasks:hang_with_a_child", {})
    outcome = other_interpreter.run_group(hang, 1, tmp_path, "hang")
    took = time.monotonic() - started
    assert outcome.timed_out
    assert outcome.exit_codes == [-9]
    assert took < 8 + 20, took  # the deadline, and the reaping after it
    # The child, killed with the group and named for the warning (python3 here).
    assert len(outcome.stragglers) == 1 and outcome.stragglers[0].startswith("python")
