"""One bad-input base with its exit code: every bad-input error is caught once, by main()."""

from __future__ import annotations

import argparse
import importlib
import pkgutil

import pytest

import dcp_invariant
from dcp_invariant import cli, errors
from dcp_invariant.suite import runner


def _package_exceptions() -> list[type[BaseException]]:
    """Every exception class the package defines, in the modules this environment can import."""
    found: dict[str, type[BaseException]] = {}
    for module in pkgutil.walk_packages(dcp_invariant.__path__, "dcp_invariant."):
        if module.name == "dcp_invariant.suite.fork_server":
            continue  # importing it makes this process die with its parent: the server's job
        try:
            loaded = importlib.import_module(module.name)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] == "dcp_invariant":
                raise
            # A module of the rank side, or one needing a runtime dependency this environment
            # lacks (torch, numpy: the quality jobs install neither): checked where it is.
            continue
        for value in vars(loaded).values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseException)
                and value.__module__ == module.name
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return [found[name] for name in sorted(found)]


# Control flow, never an error a caller sees: the CLI's signal (a BaseException, as
# KeyboardInterrupt is), the pool's "stop starting groups", the verifier's early exit, the end of
# an in-job driver's first attempt at torchrun's restart, the fork server's alarm inside a
# library's import.
CONTROL_FLOW = {"Interrupted", "Cancelled", "_TooMany", "Restarting", "_TookTooLong"}
# Its message names the install command of the torch that is installed (runtimes), which
# errors.py, standard library only, cannot import.
BAD_INPUT_ELSEWHERE = {"WorkerStartError"}
EXCEPTIONS = _package_exceptions()
BAD_INPUT: list[type[errors.BadInput]] = [e for e in EXCEPTIONS if issubclass(e, errors.BadInput)]


@pytest.mark.parametrize("kind", EXCEPTIONS, ids=lambda k: f"{k.__module__}.{k.__qualname__}")
def test_every_error_the_package_raises_has_the_one_base(kind: type[BaseException]) -> None:
    if kind.__name__ in CONTROL_FLOW:
        assert not issubclass(kind, errors.Error)
        return
    assert issubclass(kind, errors.Error)
    if issubclass(kind, errors.BadInput) and kind.__name__ not in BAD_INPUT_ELSEWHERE:
        # What a user can meet as bad input is all in the one module they import errors from.
        assert kind.__module__ == "dcp_invariant.errors"


def test_the_bad_input_errors_are_all_found() -> None:
    # The walk above must reach the suite and the CLI, not only the torch-free side.
    names = {kind.__name__ for kind in BAD_INPUT}
    assert {"UsageError", "WorkerStartError", "OutputDirError", "NotACheckpoint"} <= names
    assert len(BAD_INPUT) >= 14


@pytest.mark.parametrize(
    "kind",
    [k for k in BAD_INPUT if k.__name__ not in BAD_INPUT_ELSEWHERE],  # tested on its own below
    ids=lambda k: k.__name__,
)
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
