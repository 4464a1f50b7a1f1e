"""The Python API: ``dcp_invariant.check(fixture, ...) -> Report``. The CLI's ``run`` is built on
:func:`run_plan`, so both write the same artifact and reach the same verdict.

Importing this module imports neither torch nor the suite: ``import dcp_invariant`` stays as
cheap as the verifier needs it to be. The suite is imported when a check runs.
"""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from dcp_invariant import canonical, fixture_inputs, plan, runtimes
from dcp_invariant.errors import CheckInputError

if TYPE_CHECKING:
    from dcp_invariant.suite.output_dir import Reservation
    from dcp_invariant.suite.runner import Finished


@dataclass(frozen=True)
class ScenarioResult:
    """One scenario's verdict and, when it failed, every reason, each led by its cause class."""

    name: str
    verdict: Literal["pass", "fail"]
    reasons: tuple[str, ...]
    # What it passes with yet could matter later (a load applied at the first step, a generator
    # no step drew from), and what its groups left running: the run's ``warning:`` lines.
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Diagnosis:
    """The failures of one cause class, across the scenarios that showed it."""

    cause: str  # e.g. "state outside state_dict()", "did not round-trip through DCP"
    scenarios: tuple[str, ...]
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Report:
    """What a check found. ``str(report)`` is the message a failed test shows."""

    passed: bool
    results: Mapping[str, ScenarioResult]  # in the plan's order
    diagnoses: tuple[Diagnosis, ...]  # ranked: the likeliest root cause first
    # The evidence directory: check()'s output_dir; None when the run wrote none, or when it
    # was given none (the temporary evidence is removed once the report is built).
    artifact: Path | None
    notes: tuple[str, ...] = ()  # what the run did not check (plan.Plan.notes)

    @property
    def summary(self) -> str:
        """The verdict line ``run`` and ``in-job`` end with: ``fail: 10 passed, 1 failed;
        evidence in DIR``."""
        from dcp_invariant.evidence import rules

        failed = sum(r.verdict == "fail" for r in self.results.values())
        line = rules.verdict_line(
            "pass" if self.passed else "fail", len(self.results) - failed, failed
        )
        return line if self.artifact is None else f"{line}; evidence in {self.artifact}"

    def __str__(self) -> str:
        lines = [f"dcp-invariant: {self.summary}", *(f"note: {note}" for note in self.notes)]
        for result in self.results.values():
            lines += [f"warning: {result.name}: {w}" for w in result.warnings]
        for diagnosis in self.diagnoses:
            lines.append(f"{diagnosis.cause} ({', '.join(diagnosis.scenarios) or 'the run'}):")
            lines += [f"  - {reason}" for reason in dict.fromkeys(diagnosis.reasons)]
        return "\n".join(lines)


def check(
    fixture: str | Callable[..., Any],
    *,
    world_sizes: Iterable[int] = plan.DEFAULT_WORLD_SIZES,
    steps_before: int = plan.DEFAULT_STEPS_BEFORE,
    steps_after: int = plan.DEFAULT_STEPS_AFTER,
    output_dir: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    fixture_args: Mapping[str, Any] | None = None,
    rank_local: Sequence[str] = (),
    source_revision: str | None = None,
    ignore_attrs: Sequence[str] = (),
    resume_with_torch: Sequence[str] = (),
    cache_dir: str | os.PathLike[str] | None = None,
) -> Report:
    """Check the training loop ``fixture`` builds, as ``dcp-invariant run --fixture`` does.

    ``resume_with_torch``: registered releases that also resume each save, in environments uv
    makes under ``cache_dir`` (``--resume-with-torch``, ``--cache-dir``: docs/upgrading-torch.md).

    ``fixture`` is ``"module:callable"`` or a module-level callable; it is called as
    ``fixture(rank, world_size, **fixture_args)`` in worker processes, which import it by name.
    ``output_dir`` must not exist or be empty; the evidence is written there and the report
    names it (``Report.artifact``). With ``None``, the evidence goes to a temporary directory,
    removed once the report is built: ``Report.artifact`` is then None. Calls in several threads
    of one process run one after another. Bad input raises :class:`~dcp_invariant.BadInput`
    (one line: the problem and the fix) before anything runs or is written.
    """
    # Every argument's type first, so a wrong one is named as such, before anything is imported,
    # asked of git or written (and never reaches the code below as a TypeError).
    sizes = _sizes(world_sizes)
    for name, steps in (("steps_before", steps_before), ("steps_after", steps_after)):
        _require(name, steps, "an int", isinstance(steps, int) and not isinstance(steps, bool))
    target = _path_argument("output_dir", output_dir)
    for name, value, what, ok in (
        ("timeout", timeout, "a number of seconds or None", _is_number(timeout)),
        ("fixture_args", fixture_args, "a mapping of names to JSON values, or None",
         isinstance(fixture_args, Mapping)),
        ("source_revision", source_revision, "a 40-character hex string or None",
         isinstance(source_revision, str)),
    ):  # fmt: skip
        _require(name, value, what, value is None or ok)
    names = _names(rank_local)
    ignored = _names(ignore_attrs, "ignore_attrs")
    releases = _names(resume_with_torch, "resume_with_torch")
    cache = _path_argument("cache_dir", cache_dir)
    if cache is not None and not releases:
        raise CheckInputError(
            "cache_dir goes with resume_with_torch (it holds the other releases' environments): "
            "give resume_with_torch, or drop cache_dir"
        )
    spec = fixture_spec(fixture)
    run = plan.fixture_plan(
        spec,
        sizes,
        steps_before,
        steps_after,
        fixture_args,
        names,
        ignored_attrs=ignored,
        resume_with_torch=releases,
        torch_release=runtimes.installed_release() if releases else "",
    )
    seconds = checked_timeout(timeout)
    revision = source_revision_of(source_revision)
    if target is not None:
        return run_plan(run, target, timeout=seconds, revision=revision, cache_dir=cache)
    home = Path(tempfile.mkdtemp(prefix="dcp-invariant-"))
    try:
        report = run_plan(
            run, home / "evidence", timeout=seconds, revision=revision, cache_dir=cache
        )
    except BaseException:
        shutil.rmtree(home, ignore_errors=True)  # nothing written: the directory was ours
        raise
    # Evidence no one asked to keep: the report holds every verdict and reason, and a check run
    # on every pull request would fill a long-lived runner's temp directory (about 1.4 MB a
    # run). Only this process wrote it, and it is closed. The report then names no directory.
    shutil.rmtree(home)
    return dataclasses.replace(report, artifact=None)


def run_plan(
    run: plan.Plan,
    output_dir: Path,
    *,
    timeout: float,
    revision: str,
    on_finish: Callable[[Finished], None] | None = None,
    cache_dir: Path | None = None,
) -> Report:
    """Run ``run``'s scenarios and write the artifact to ``output_dir``; the report it holds.

    ``cache_dir``: where the environments of ``run.resume_with_torch`` live."""
    from dcp_invariant.evidence import provenance
    from dcp_invariant.evidence.diagnosis import TIMEOUT
    from dcp_invariant.suite import output_dir as reserve
    from dcp_invariant.suite import pool, reaper, runner

    reservation = reserve.Reservation(output_dir)
    try:
        # Started here, not by the suite: the guardian must outlive the artifact's writing, so
        # that a SIGKILL at any moment before the reservation is released leaves nothing of it.
        # Its token is set in this process's environment: a run in another thread waits.
        with pool.one_run_at_a_time(), reaper.Guardian() as guardian:
            guardian.release_if_killed(reservation.lock_path)
            try:
                try:
                    suite = runner.run_suite(
                        run_plan=run,
                        timeout=timeout,
                        on_finish=on_finish,
                        guardian=guardian,
                        cache_dir=cache_dir,
                    )
                except runner.FixtureTimeout as exc:
                    timed_out = Diagnosis(TIMEOUT, (), (str(exc),))
                    return Report(False, MappingProxyType({}), (timed_out,), None)
                record = provenance.build(
                    source_revision=revision,
                    torch_distribution=suite.torch_distribution,
                    torch_runtime=suite.torch_runtime,
                    numpy=suite.numpy,
                    run_plan=suite.run_plan,
                )
                return finish(suite.observations, record, suite.run_plan, reservation)
            finally:
                reservation.release()  # before the guardian hears that the run ended
    finally:
        reservation.release()  # the guardian could not be started


def finish(
    observations: dict[str, dict[str, Any]],
    provenance: dict[str, Any],
    run: plan.Plan,
    reservation: Reservation,
) -> Report:
    """The one way a run ends, on either host (this machine's workers, or rank 0 of the user's
    torchrun job): judge the observations, write the artifact into ``reservation``'s output
    directory, and return the report its files hold. The caller releases the reservation."""
    from dcp_invariant.evidence import artifact, schema

    files = artifact.build(observations, provenance, run_plan=run)
    try:
        reservation.fill(files)
    except OSError as exc:
        raise CheckInputError(
            f"the artifact could not be written to {reservation.target}: {exc}"
        ) from exc
    results = {}
    for name in run.names:
        record = canonical.loads(files[schema.result_file(name)])
        results[name] = ScenarioResult(
            name, record["verdict"], tuple(record["reasons"]), tuple(record.get("warnings", ()))
        )
    summary = canonical.loads(files[schema.SUMMARY_FILE])
    return Report(
        summary["verdict"] == "pass",
        MappingProxyType(results),
        ranked(results.values()),
        reservation.target,
        run.notes,
    )


def ranked(results: Iterable[ScenarioResult]) -> tuple[Diagnosis, ...]:
    """Failures grouped by cause class, the diagnosis's ranked causes first, then the others in
    the order they first appear."""
    from dcp_invariant.evidence import diagnosis

    by_cause: dict[str, tuple[list[str], list[str]]] = {}
    for result in results:
        for reason in result.reasons:
            cause = reason.split(": ", 1)[0] if ": " in reason else reason
            scenarios, reasons = by_cause.setdefault(cause, ([], []))
            if result.name not in scenarios:
                scenarios.append(result.name)
            reasons.append(reason)
    order = {cause: i for i, cause in enumerate(diagnosis.RANKED_CAUSES)}
    causes = sorted(by_cause, key=lambda c: order.get(c, len(order)))  # stable: first seen
    return tuple(Diagnosis(c, tuple(by_cause[c][0]), tuple(by_cause[c][1])) for c in causes)


def fixture_spec(fixture: str | Callable[..., Any]) -> str:
    """``"module:callable"`` for ``fixture``: workers import it by that name."""
    if isinstance(fixture, str):
        return fixture
    if not callable(fixture):
        raise CheckInputError(
            f"fixture {fixture!r} is neither 'module:callable' nor a callable: pass one of the two"
        )
    module = getattr(fixture, "__module__", None)
    qualname = getattr(fixture, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str):
        raise CheckInputError(
            f"fixture {fixture!r} has no module-level name workers could import: "
            "pass 'module:callable' instead"
        )
    if "<" in qualname:  # <lambda>, <locals>
        raise CheckInputError(
            f"fixture {module}.{qualname} is a lambda or defined inside a function, and worker "
            "processes import it by name: define it at the top level of a module"
        )
    if module == "__main__":
        raise CheckInputError(
            f"fixture {qualname} is defined in the script being run (__main__), which worker "
            "processes cannot import by name: move it into a module"
        )
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part, None)
    if target is not fixture:
        raise CheckInputError(
            f"fixture {module}:{qualname} does not name the callable given (a decorator that "
            "hides its name?): pass 'module:callable' naming what workers should call"
        )
    return f"{module}:{qualname}"


def _require(name: str, value: object, expected: str, holds: bool) -> None:
    """Refuse ``value`` for the argument ``name`` unless ``holds``, naming the type expected."""
    if not holds:
        raise CheckInputError(
            f"{name} must be {expected}, got {type(value).__name__} {fixture_inputs.shown_value(value)}"
        )


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)  # True is an int too


def _sizes(world_sizes: Iterable[int]) -> tuple[int, ...]:
    if isinstance(world_sizes, (str, bytes)):
        raise CheckInputError(f"world sizes {world_sizes!r}: give integers, e.g. (1, 2)")
    _require(
        "world_sizes",
        world_sizes,
        "an iterable of ints, e.g. (1, 2)",
        isinstance(world_sizes, Iterable),
    )
    # One more than the plan allows is enough to refuse: an endless iterator is not read to
    # its end.
    sizes = tuple(itertools.islice(world_sizes, plan.MAX_WORLD_SIZE + 1))
    for size in sizes:
        _require(
            "world_sizes",
            size,
            "made of ints, e.g. (1, 2)",
            isinstance(size, int) and not isinstance(size, bool),
        )
    return sizes


def _names(given: Sequence[str], argument: str = "rank_local") -> tuple[str, ...]:
    """``rank_local`` (top-level keys of state_dict()), ``ignore_attrs`` (attribute paths) or
    ``resume_with_torch`` (releases): a str is one name, never its characters."""
    what = _WHAT[argument]
    if isinstance(given, str):  # "data" would otherwise be four components
        return (given,)
    _require(argument, given, f"a str or a sequence of str ({what})", isinstance(given, Iterable))
    names = tuple(given)
    for name in names:
        _require(argument, name, f"made of str ({what})", isinstance(name, str))
    return names


_WHAT = {
    "rank_local": "top-level keys of state_dict()",
    "ignore_attrs": "attribute paths such as app.ema",
    "resume_with_torch": "registered releases such as 2.15.0",
}


def _path_argument(name: str, value: str | os.PathLike[str] | None) -> Path | None:
    """A directory argument as a Path, or None; anything no file name can be is refused."""
    if value is None:
        return None
    _require(
        name, value, "a str or os.PathLike path, or None", isinstance(value, (str, os.PathLike))
    )
    path = os.fspath(value)
    _require(name, value, "a str path (not bytes)", isinstance(path, str))
    if "\0" in path:
        raise CheckInputError(
            f"{name} {fixture_inputs.shown_value(path)} holds a NUL character, which no file name "
            "can: pass the directory's real path"
        )
    return Path(path)


def checked_timeout(timeout: float | None, name: str = "timeout") -> float:
    """Seconds each worker group may take; the default when ``None``. ``name``: the argument's
    name in the message (the CLI's flag)."""
    if timeout is None:
        return plan.DEFAULT_TIMEOUT
    # The range before math.isfinite: comparing an int is exact, converting a huge one to float
    # raises OverflowError. NaN fails every comparison, so the range refuses it too.
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout <= plan.MAX_TIMEOUT
        or not math.isfinite(timeout)
    ):
        raise CheckInputError(
            f"{name} must be a number of seconds from 0 to {plan.MAX_TIMEOUT:g}, got "
            f"{fixture_inputs.shown_value(timeout)}"
        )
    return float(timeout)


def source_revision_of(given: str | None, name: str = "source_revision") -> str:
    """The revision under test: ``given``, else ``$GITHUB_SHA``, else ``git rev-parse HEAD``,
    else :data:`~dcp_invariant.evidence.provenance.UNKNOWN_REVISION` (outside a git checkout:
    nothing checks the revision, so a run there is not refused). ``name``: how a message names
    the argument (the CLI's flag)."""
    from dcp_invariant.evidence.provenance import UNKNOWN_REVISION, valid_revision

    if given is not None:
        if not valid_revision(given):
            raise CheckInputError(f"{name} {given!r} is not a 40-character lowercase hex revision")
        return given
    env = os.environ.get("GITHUB_SHA", "")
    if env:
        if not valid_revision(env):
            raise CheckInputError(f"$GITHUB_SHA {env!r} is not a 40-hex revision: pass {name}")
        return env
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        done = None
    revision = done.stdout.strip() if done is not None and done.returncode == 0 else ""
    return revision if valid_revision(revision) else UNKNOWN_REVISION


@dataclass(frozen=True)
class CrashPoint:
    """One crash point of :func:`check_job`: how and where the job was stopped (``name``: the
    signal, then the process, operation number and kind, path, steps printed), and why its
    relaunch fails, if it does."""

    name: str
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class JobReport:
    """What :func:`check_job` found. ``str(report)`` is ``preempt``'s report, grouped by cause."""

    passed: bool
    points: tuple[CrashPoint, ...]  # in the order the job made the operations
    skipped: tuple[str, ...]  # points the second uninterrupted launch did not reach alike
    evidence: Path | None  # output_dir's preempt.json, when output_dir was given
    lines: tuple[str, ...] = ()

    def __str__(self) -> str:
        return "\n".join(self.lines)


def check_job(
    command: str | Sequence[str],
    *,
    final: str | None = None,
    step_line: str | None = None,
    crash_points: int = plan.PREEMPT_CRASH_POINTS,
    timeout: float = plan.PREEMPT_TIMEOUT,
    output_dir: str | os.PathLike[str] | None = None,
    sigterm_points: int = plan.PREEMPT_SIGTERM_POINTS,
    grace: float = plan.PREEMPT_GRACE,
) -> JobReport:
    """``dcp-invariant preempt`` from Python: your own training command (``{run_dir}`` in it),
    killed at the points of its own saves and relaunched; docs/preempt.md says how.

    ``command`` is a list of arguments, or a string split as a shell would (``shlex.split``)
    and never given to one. Bad input raises :class:`dcp_invariant.BadInput` before anything
    is launched; Linux only.
    """
    import shlex

    from dcp_invariant.preempt import command as preempt
    from dcp_invariant.preempt.launch import Launches

    _require("crash_points", crash_points, "an int", type(crash_points) is int)
    _require("timeout", timeout, "a number of seconds", _is_number(timeout))
    _require("sigterm_points", sigterm_points, "an int", type(sigterm_points) is int)
    _require("grace", grace, "a number of seconds", _is_number(grace))
    try:
        argv = shlex.split(command) if isinstance(command, str) else [str(a) for a in command]
    except ValueError as exc:  # an unclosed quote
        raise CheckInputError(f"command {command!r}: {exc}: close its quotes") from None
    options = preempt.checked_options(
        argv,
        step_line,
        final,
        crash_points,
        timeout,
        _path_argument("output_dir", output_dir),
        sigterm_points,
        float(grace),
    )
    launches = Launches()
    try:
        outcome = preempt.check(options, launches)
    finally:
        launches.stop_all()  # an interrupt or an error: no launch outlives the call
    lines, code = preempt.report(outcome)
    evidence = None
    if options.output_dir is not None:
        from dcp_invariant.evidence.preempt import record

        record.write(options.output_dir, preempt.evidence(options, outcome))
        evidence = options.output_dir / record.PREEMPT_FILE
    points = tuple(  # the reasons are in the order the job made the operations
        CrashPoint(outcome.described(k), tuple(reasons)) for k, reasons in outcome.reasons.items()
    )
    return JobReport(
        passed=code == 0,
        points=points,
        skipped=tuple(outcome.described(p) for p in outcome.varied),
        evidence=evidence,
        lines=tuple(lines),
    )
