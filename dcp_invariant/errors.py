"""What the CLI's exit codes mean, the one base of every error dcp-invariant raises on purpose,
and every bad-input error a user can meet, from the CLI or from ``check()``.

As cibuildwheel's ``errors.py`` does, an error carries its own exit code, so ``main()`` catches
:class:`BadInput` once instead of mapping each type by hand. The commit protocol's and
``inspect``'s findings keep modules of their own (:mod:`dcp_invariant.commit.errors`,
:mod:`dcp_invariant.inspection.errors`), under the same :class:`Error`. Standard library only:
the shared modules (plan, runtimes) and both sides of the package raise these.
"""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0  # every invariant holds, or the artifact verifies
EXIT_FAIL: Final = 1  # an invariant failed, or the artifact is invalid: every reason is printed
EXIT_USAGE: Final = 2  # bad input: one line naming the problem and the fix; nothing written


class Error(Exception):
    """The base of every error dcp-invariant raises on purpose: ``except dcp_invariant.Error``
    catches them all, and nothing else."""


class BadInput(Error):
    """Input or an environment the run cannot start with. Its message is one line a user can
    act on: what is wrong and how to fix it. Raised before any expensive work."""

    exit_code: int = EXIT_USAGE
    # What ``--debug`` prints after the line (a broken installation's worker log, say).
    details: str = ""


# --- bad input, by what is at fault ----------------------------------------------------------


class UsageError(BadInput):
    """A command line the CLI cannot run."""


class CheckInputError(BadInput):
    """An argument of :func:`dcp_invariant.check` (or a CLI flag) the run cannot start with."""


class PlanError(BadInput, ValueError):
    """A plan outside the grammar: the message names the value and what is allowed."""


class FixtureProblem(BadInput, ValueError):
    """The fixture does not follow the interface; the message says what to change."""


class FixtureError(FixtureProblem):
    """A fixture spec that does not name a usable fixture (a misspelt module or callable, one
    that cannot be called with the fixture arguments): found where the spec is resolved, in the
    runner's probe, a worker, or each rank of an ``in-job`` job alike."""


class FrameworkMissing(FixtureError):
    """The framework an adapter wraps (:mod:`dcp_invariant.adapters`) is not installed in the
    workers' Python."""


class OutputDirError(BadInput):
    """The output directory cannot take an artifact; the message says what to change."""


class EnvironmentProblem(BadInput):
    """The machine, not the checkpoint under test, is at fault."""


class UnsupportedRuntime(BadInput):
    """The installed torch is not one dcp-invariant has registered."""


class ReleaseEnvError(EnvironmentProblem):
    """The environment of another torch release (``--resume-with-torch``) cannot be made or
    used: the message names the release and what to change."""


class StartMethodError(BadInput, ValueError):
    """DCP_INVARIANT_START_METHOD names no usable start method."""


class InJobError(BadInput):
    """The job cannot run the checks as launched; the message says what to change."""


class PreemptInputError(BadInput):
    """``preempt``: a command, option or job that the check cannot start with (no ``{run_dir}``,
    a command not found, a bad ``--step-line``, a job that does not repeat itself)."""


class ActionInputError(BadInput, ValueError):
    """An input of the composite action the job cannot run with; the message names the input."""


class ArtifactNameError(BadInput, ValueError):
    """An artifact name GitHub's upload would refuse."""


class UseNumberError(BadInput, ValueError):
    """``--use`` is not a count of the action's uses in the job (1 for the first)."""


class NotACheckpoint(BadInput):
    """``inspect DIR``: DIR is missing, is not a directory, or holds no ``.metadata``."""


class BadWorldSize(BadInput):
    """``inspect --world-size`` is not a positive number of ranks."""


# --- the user's code, at run time ------------------------------------------------------------


class AppRaised(Error, RuntimeError):
    """The user's code raised, inside a rank: the fixture function or one of the app's methods
    (``method``, one of :data:`dcp_invariant.plan.APP_METHODS`), with any ``BaseException`` but
    the tool's own interrupt. ``error`` is what it raised; its traceback goes to the worker's
    log, its type (never its message, which may hold paths) to the evidence."""

    def __init__(self, method: str, error: BaseException) -> None:
        where = "the fixture" if method == "fixture" else f"the app's {method}()"
        super().__init__(f"{where} raised {type(error).__name__}: {error}")
        self.method = method
        self.error = error
