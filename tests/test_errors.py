"""One bad-input base with its exit code: every bad-input error is caught once, by main()."""

from __future__ import annotations

import argparse

import pytest

from dcp_invariant import cli, errors, github, plan, runtimes
from dcp_invariant.suite import output_dir, pool, runner, workspace

BAD_INPUT: list[type[errors.BadInput]] = [
    cli.UsageError,
    plan.PlanError,
    runtimes.UnsupportedRuntime,
    runner.FixtureProblem,
    workspace.EnvironmentProblem,
    pool.StartMethodError,
    output_dir.OutputDirError,
    github.ArtifactNameError,
]


@pytest.mark.parametrize("kind", BAD_INPUT, ids=lambda k: k.__name__)
def test_every_bad_input_error_exits_2_with_its_one_line(
    kind: type[errors.BadInput], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def raises(args: argparse.Namespace) -> int:
        raise kind("the problem; the fix")

    monkeypatch.setattr(cli, "_list", raises)

    assert cli.main(["list"]) == errors.EXIT_USAGE
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == "dcp-invariant: error: the problem; the fix\n"


def test_a_broken_installation_shows_its_worker_log_only_with_debug(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def raises(args: argparse.Namespace) -> int:
        raise runner.WorkerStartError([1], "ModuleNotFoundError: No module named 'numpy'\n")

    monkeypatch.setattr(cli, "_list", raises)

    assert cli.main(["list"]) == errors.EXIT_USAGE
    (line,) = capsys.readouterr().err.splitlines()
    assert "a worker could not import numpy (exit codes [1]); reinstall torch" in line
    assert "--index-url https://download.pytorch.org/whl/cpu" in line

    assert cli.main(["--debug", "list"]) == errors.EXIT_USAGE
    assert "ModuleNotFoundError: No module named 'numpy'" in capsys.readouterr().err


def test_an_error_that_is_not_bad_input_is_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    def raises(args: argparse.Namespace) -> int:
        raise KeyError("a bug in this package")

    monkeypatch.setattr(cli, "_list", raises)

    with pytest.raises(KeyError):
        cli.main(["list"])
