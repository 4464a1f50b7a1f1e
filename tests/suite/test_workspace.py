"""The run's workspace and what the runner makes of a machine at fault."""

from __future__ import annotations

import errno
import tempfile
from pathlib import Path
from typing import Any

import pytest

from dcp_invariant import plan
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


def test_a_missing_module_is_named_not_blamed_on_torch() -> None:
    logs = "Traceback ...\nModuleNotFoundError: No module named 'numpy'\n"
    assert "a worker could not import numpy" in str(runner.WorkerStartError([1], logs))


def test_a_full_workspace_stops_the_run_instead_of_failing_the_scenario(tmp_path: Path) -> None:
    pool: Any = None  # no worker runs
    ctx = ScenarioContext(
        plan.SCENARIOS[0], pool, tmp_path, plan.REGISTERED_FIXTURE, plan.REGISTERED
    )
    obs = ctx.begin()
    with (
        pytest.raises(workspace.EnvironmentProblem, match="No space left on device"),
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
    with pytest.raises(workspace.EnvironmentProblem, match="No space left on device"):
        runner._refuse_environment_failures(ctx)


def test_too_little_free_space_is_refused(tmp_path: Path) -> None:
    with pytest.raises(workspace.EnvironmentProblem, match="free space there"):
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
