"""The run's workspace and what the runner makes of a machine at fault."""

from __future__ import annotations

import errno
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dcp_invariant import errors, plan
from dcp_invariant.suite import runner, workspace
from dcp_invariant.suite.pool import GroupOutcome
from dcp_invariant.suite.scenarios.common import ScenarioContext


def test_a_workspace_is_locked_while_used_and_swept_only_once_its_owner_is_gone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with workspace.Workspace() as path:
        assert path.parent == tmp_path and path.name.startswith(workspace.PREFIX)
        assert workspace.sweep_stale(tmp_path) == []  # locked by us: alive
        (path / "ro").mkdir()
        (path / "ro" / "f").write_bytes(b"x")
        (path / "ro" / "f").chmod(0o444)
        (path / "ro").chmod(0o555)  # a promoted generation is read-only
    assert list(tmp_path.iterdir()) == []
    dead = tmp_path / f"{workspace.PREFIX}dead"
    dead.mkdir()
    (dead / workspace.LOCK_FILE).write_bytes(b"")
    unfinished = tmp_path / f"{workspace.PREFIX}new"  # no lock yet: being created, left alone
    unfinished.mkdir()
    assert workspace.sweep_stale(tmp_path) == [dead]
    assert list(tmp_path.iterdir()) == [unfinished]


@pytest.mark.skipif(sys.platform == "win32", reason="a lock file held open there cannot be deleted")
def test_another_runs_sweep_never_takes_a_live_workspace_for_a_dead_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs in one temp directory (pytest-xdist workers calling check()): one's sweep may
    come while the other's workspace is being set up or removed."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    real_lock, real_remove = workspace.lock_exclusive, workspace.remove
    swept: list[list[Path]] = []
    sweeping = False

    def another_run_sweeps(then: Callable[[Any], None]) -> Callable[[Any], None]:
        def hook(arg: Any) -> None:
            nonlocal sweeping
            if not sweeping:  # the sweep locks and removes through these too
                sweeping = True
                swept.append(workspace.sweep_stale(tmp_path))
                sweeping = False
            then(arg)

        return hook

    monkeypatch.setattr(workspace, "lock_exclusive", another_run_sweeps(real_lock))
    with workspace.Workspace() as path:
        monkeypatch.setattr(workspace, "lock_exclusive", real_lock)
        (path / "server").mkdir()  # what the run does next: it failed with ENOENT
        monkeypatch.setattr(workspace, "remove", another_run_sweeps(real_remove))
    assert swept == [[], []]  # during set-up, then during removal: alive both times
    assert list(tmp_path.iterdir()) == []


def test_a_sweep_goes_on_past_a_workspace_it_cannot_remove(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = [tmp_path / f"{workspace.PREFIX}{n}" for n in "ab"]
    for path in dead:
        path.mkdir()
        (path / workspace.LOCK_FILE).write_bytes(b"")
    real_remove = workspace.remove

    def first_removed_by_another_sweep(path: Path) -> None:
        real_remove(path)
        if path == dead[0]:
            raise FileNotFoundError(2, "No such file or directory", str(path / "x"))

    monkeypatch.setattr(workspace, "remove", first_removed_by_another_sweep)
    assert workspace.sweep_stale(tmp_path) == [dead[1]]
    assert list(tmp_path.iterdir()) == []


def test_a_missing_module_is_named_not_blamed_on_torch() -> None:
    logs = "Traceback ...\nModuleNotFoundError: No module named 'numpy'\n"
    assert "a worker could not import numpy" in str(runner.WorkerStartError([1], logs))


def test_a_worker_that_failed_otherwise_is_not_sent_to_reinstall_torch() -> None:
    logs = "Traceback ...\nRuntimeError: the fixture's module raised at import\n"
    message = str(runner.WorkerStartError([1], logs))
    assert message == (
        "a worker failed before its first task: RuntimeError: the fixture's module raised at "
        "import (exit codes [1]); its log: --debug"
    )
    broken = "Traceback ...\nImportError: libtorch_cpu.so: cannot open shared object file\n"
    assert "reinstall torch" in str(runner.WorkerStartError([1], broken))
    # A dotted exception whose message names torch is still the loop's, not the installation's.
    dotted = "Traceback ...\ntorch.distributed.DistBackendError: torch says no\n"
    assert "failed before its first task: torch.distributed.DistBackendError: torch says no" in (
        str(runner.WorkerStartError([1], dotted))
    )


def test_a_full_workspace_stops_the_run_instead_of_failing_the_scenario(tmp_path: Path) -> None:
    pool: Any = None  # no worker runs
    ctx = ScenarioContext(
        plan.SCENARIOS[0], pool, tmp_path, plan.REGISTERED_FIXTURE, plan.REGISTERED
    )
    obs = ctx.begin()
    with (
        pytest.raises(errors.EnvironmentProblem, match="No space left on device"),
        ctx.recording(obs),
    ):
        raise OSError(errno.ENOSPC, "No space left on device", "ckpt")
    with ctx.recording(obs):
        raise OSError(errno.ENOENT, "No such file or directory", "ckpt")
    assert obs["errors"] == ["the driver stopped on FileNotFoundError"]


def test_a_worker_that_ran_out_of_space_stops_the_run(tmp_path: Path) -> None:
    log = tmp_path / "source-rank0.log"
    log.write_text("OSError: [Errno 28] No space left on device: 'ckpt/x'\n")
    pool: Any = None  # no worker runs
    ctx = ScenarioContext(
        plan.SCENARIOS[0], pool, tmp_path, plan.REGISTERED_FIXTURE, plan.REGISTERED
    )
    ctx.outcomes.append(("source", GroupOutcome([1], False, [], [log])))
    with pytest.raises(errors.EnvironmentProblem, match="No space left on device"):
        runner._refuse_environment_failures(ctx)


def test_too_little_free_space_is_refused(tmp_path: Path) -> None:
    with pytest.raises(errors.EnvironmentProblem, match="free space there"):
        workspace.check_free(tmp_path, "the temp directory", needed=1 << 62)


def test_a_workspace_that_cannot_be_removed_does_not_lose_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def refuse(path: Path) -> None:
        raise PermissionError(13, "The process cannot access the file", str(path))

    monkeypatch.setattr(workspace, "remove", refuse)
    with workspace.Workspace() as path:
        pass  # the scenarios ran; their observations are in memory
    assert "could not remove the workspace" in capsys.readouterr().err
    monkeypatch.undo()
    assert workspace.sweep_stale(tmp_path) == [path]  # unlocked: the next run removes it


SECOND_RUN_IN_ONE_PROCESS = """
import os, sys
from pathlib import Path
from dcp_invariant.suite import workspace
parent = Path(sys.argv[1])
first = workspace._short_socket_directory(parent)
second = workspace._short_socket_directory(parent)
made = list(first.parent.glob(f"{workspace.SOCKET_HOLDER_PREFIX}{os.getpid()}-*"))
print(first == second, len(made), workspace.socket_holder_owner(first) == os.getpid())
"""


@pytest.mark.skipif(sys.platform == "win32", reason="no socket holder on Windows")
def test_one_process_makes_one_socket_holder_however_many_runs_it_starts(tmp_path: Path) -> None:
    # multiprocessing picks its socket directory once per process; a holder per run would stay
    # empty, and stay until the process exits (a test session calling check() made dozens).
    long_parent = tmp_path / ("p" * 70)
    long_parent.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", SECOND_RUN_IN_ONE_PROCESS, str(long_parent)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "1", "True"], done.stdout


def test_a_socket_holders_owner_is_read_from_its_name() -> None:
    assert workspace.socket_holder_owner(Path("/tmp/dcpi-4242-x1y2")) == 4242
    assert workspace.socket_holder_owner(Path("/tmp/dcpi-abc-x1y2")) is None
    assert workspace.socket_holder_owner(Path("/tmp/pymp-4242")) is None
