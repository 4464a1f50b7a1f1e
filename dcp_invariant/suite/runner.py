"""Running the scenarios: one fork server, two scenarios at a time, the longest ones first.

The runner process itself never imports torch: workers do, forked from a server that preloaded
it (Linux) or spawned ahead of need (:mod:`.pool`). The elastic scenario starts first because
its torchrun job (a fresh agent and fresh workers, as torch launches them) is the longest path
through the suite.
"""

from __future__ import annotations

import contextlib
import multiprocessing.util
import os
import re
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcp_invariant import other_release, plan, regular_file, runtimes
from dcp_invariant.errors import (
    BadInput,
    EnvironmentProblem,
    Error,
    FixtureProblem,
    ReleaseEnvError,
)
from dcp_invariant.evidence import rules
from dcp_invariant.suite import reaper, release_env
from dcp_invariant.suite.console import Log
from dcp_invariant.suite.pool import (
    Cancelled,
    StandbyFailed,
    WorkerPool,
    caller_main_hidden,
    one_run_at_a_time,
)
from dcp_invariant.suite.scenarios import DRIVERS, payloads
from dcp_invariant.suite.scenarios.common import SNAPSHOTS, STORE_ROOT, ScenarioContext
from dcp_invariant.suite.scenarios.host import PoolHost, ReleaseHost
from dcp_invariant.suite.scenarios.shared_groups import SharedGroups
from dcp_invariant.suite.torchrun.agent import Agent
from dcp_invariant.suite.workspace import Workspace

PARALLEL = 2


@dataclass(frozen=True)
class Finished:
    """What the console hears about a scenario as it finishes (never written to evidence)."""

    name: str
    verdict: str
    seconds: float
    reasons: list[str]
    logs: list[Log]  # a failing scenario's notes and every worker log, whole; none of a pass
    warnings: list[str] = field(default_factory=list)


@dataclass
class SuiteRun:
    run_plan: plan.Plan  # as run: a fixture's, with who checkpoints its app (the probe's finding)
    observations: dict[str, dict[str, Any]]
    torch_distribution: str
    torch_runtime: str
    numpy: str | None


class WorkerStartError(BadInput, RuntimeError):
    """A fresh worker could not even report torch's version: the installation is broken."""

    def __init__(self, exit_codes: list[int], logs: str) -> None:
        self.logs = self.details = logs  # --debug prints the worker's log
        missing = re.findall(r"No module named '([^']+)'", logs)
        codes = f" (exit codes {exit_codes})" if exit_codes else ""
        errors = _error_lines(logs)
        broken = not errors or _failed_to_load(errors[-1])
        if missing or broken:
            what = (
                f"could not import {missing[-1]}" if missing else "could not import torch and numpy"
            )
            command = runtimes.install_command(runtimes.installed_distribution() or "")
            fix = f"reinstall torch as its CPU wheel ({command.replace('+cpu', '')}) and numpy"
        else:
            # Not the installation: what the worker raised, in one line (--debug: its log).
            what, fix = f"failed before its first task: {errors[-1][:200]}", "its log: --debug"
        super().__init__(f"a worker {what}{codes}; {fix}")


def _cache(given: Path | None) -> Path:
    return Path(
        other_release.cache_dir(
            None if given is None else str(given), os.environ, sys.platform, Path.home()
        )
    )


def _error_lines(logs: str) -> list[str]:
    """The lines of worker logs that name a raised error, as a traceback ends."""
    return re.findall(r"^([\w.]*(?:Error|Exception)\b.*)$", logs, re.M)


def _failed_to_load(error: str) -> bool:
    """Whether an error line is an import, or the loading of a shared library, failing: what an
    installation that is broken raises."""
    return re.match(r"(?:\w+\.)*(?:ImportError|ModuleNotFoundError|OSError)\b", error) is not None


def run_suite(
    *,
    run_plan: plan.Plan,
    names: Sequence[str] | None = None,
    fixture: str | None = None,
    timeout: float = plan.DEFAULT_TIMEOUT,
    on_finish: Callable[[Finished], None] | None = None,
    guardian: reaper.Guardian | None = None,
    cache_dir: Path | None = None,
) -> SuiteRun:
    """Run the plan's scenarios (or ``names`` of them) and return their observations.

    ``fixture`` replaces the plan's fixture (the live tests run registered scenarios on broken
    variants). ``guardian``: the caller's, which outlives the suite (it guards the output
    directory until the artifact is written); without it, the suite starts and ends its own.
    ``cache_dir``: where the environments of the plan's other torch releases are (made and)
    found (:mod:`.release_env`).

    Raises UnsupportedRuntime, WorkerStartError, FixtureProblem or ReleaseEnvError before any
    scenario.
    """
    distribution = runtimes.installed_distribution()
    runtimes.require(distribution)
    assert distribution is not None
    fixture = run_plan.fixture if fixture is None else fixture
    lock = threading.Lock()
    observations: dict[str, dict[str, Any]] = {}
    space = Workspace()
    guarding = reaper.Guardian() if guardian is None else contextlib.nullcontext(guardian)
    with one_run_at_a_time(), caller_main_hidden(), guarding as guardian, space as workspace:
        guardian.remove_if_killed(workspace)
        pool = WorkerPool(timeout, fixture=fixture)
        other_pools: dict[str, WorkerPool] = {}
        pools = [pool]  # and each other release's, once its environment is there
        agent: Agent | None = None
        try:
            pool.start(workspace / "server")
            guardian.remove_if_killed(Path(multiprocessing.util.get_temp_dir()))
            if space.socket_holder is not None:
                guardian.remove_if_killed(space.socket_holder)
            # The restart's torchrun agent imports torch on a core the pool's start leaves
            # idle, and waits: it starts no rank and runs nothing of the user's before its
            # scenario says go (torchrun/agent.py), and takes no CPU the checks below need.
            restart = _restart_scenario(run_plan, names)
            if restart is not None and pool.idle_cores() > 0:
                agent = Agent(pool, workspace / restart)
            versions = _probe(pool, workspace / "probe")
            runtimes.require(distribution, versions["torch"])
            if run_plan.kind == "fixture":
                found = _probe_fixture(pool, workspace / "fixture-probe", fixture, run_plan)
                # The probe found who saves the app: an app with its own save() and load() has
                # scenarios of its own (plan.fixture_plan).
                run_plan = run_plan.checkpointed_by(found)
            # After the fixture's own probe, still before any scenario: a fault of the fixture is
            # said before B is installed (several GB where B is PyPI's build), and not blamed on
            # B; a release that cannot be installed is one line and exit 2.
            other_envs = [
                release_env.ensure(release_env.recipe_for(r, distribution), _cache(cache_dir))
                for r in run_plan.resume_with_torch
            ]
            search_path = release_env.worker_search_path() if other_envs else []
            for env in other_envs:
                other = WorkerPool(
                    timeout, python=env.python, search_path=[str(env.package_path), *search_path]
                )
                other_pools[env.release] = other
                pools.append(other)
                other.start(workspace / f"server-{env.release}")
            for env in other_envs:
                _probe_release(other_pools[env.release], workspace, env, fixture, run_plan)
            names = run_plan.names if names is None else names
            # The longest scenarios first, so they overlap the rest: the torchrun job, then
            # async_save's process mode (each rank starts a checkpoint process of its own).
            order = sorted(
                names,
                key=lambda n: (
                    run_plan.scenario(n).family != "elastic",
                    run_plan.scenario(n).async_mode != "process",
                ),
            )
            host = PoolHost(
                pool, SharedGroups(workspace / "shared", (STORE_ROOT, SNAPSHOTS)), agent
            )
            releases = {
                env.release: ReleaseHost(
                    PoolHost(other_pools[env.release]), versions["torch"], env.torch
                )
                for env in other_envs
            }

            begun: list[str] = []

            def refuse_if_cancelled() -> None:
                if pool.cancelled:
                    raise Cancelled("the run is being interrupted")

            def one(name: str) -> None:
                started = time.monotonic()
                # A copy or a hash of a file gigabytes long stops within the 2 s an interrupt
                # has (regular_file.check_interruption), not when it is done.
                regular_file.INTERRUPTION.set(refuse_if_cancelled)
                with lock:
                    begun.append(name)
                    if len(begun) == len(order):
                        pool.wind_down()
                scenario = run_plan.scenario(name)
                workdir = workspace / name
                workdir.mkdir(exist_ok=agent is not None and name == restart)  # it waits there
                ctx = ScenarioContext(scenario, host, workdir, fixture, run_plan, releases=releases)
                obs = DRIVERS[scenario.family](ctx)
                if pool.cancelled:
                    raise Cancelled("the run is being interrupted")  # its outcome means nothing
                _refuse_environment_failures(ctx)
                elapsed = time.monotonic() - started
                obs = ctx.finished(obs)
                left_running = ctx.left_running_record()
                reasons, cautions = rules.judge(name, obs, run_plan=run_plan)
                logs = [] if not reasons else _logs(ctx)
                with lock:
                    observations[name] = obs
                    if on_finish is not None:
                        on_finish(
                            Finished(
                                name,
                                "fail" if reasons else "pass",
                                elapsed,
                                reasons,
                                logs,
                                cautions + rules.warnings(left_running),
                            )
                        )

            with ThreadPoolExecutor(
                max_workers=PARALLEL, thread_name_prefix="scenario"
            ) as executor:
                try:
                    _results([executor.submit(one, name) for name in order])
                except BaseException:
                    # An interrupt, or one scenario's bug: stop the others now, not after them.
                    for each in pools:
                        each.cancel()
                    executor.shutdown(wait=True, cancel_futures=True)
                    raise
        except BaseException:
            for each in pools:
                each.cancel()
            raise
        finally:
            # Before the workspace goes and the fork server's resource tracker is stopped (which
            # waits for every process holding its pipe): whatever the run started, and whatever
            # those started, ends here, interrupted or not.
            try:
                guardian.sweep()
            except BaseException:
                guardian.sweep()  # a signal cut the sweep short; the next one is ignored
                raise
            finally:
                try:
                    if agent is not None:
                        agent.close()  # an agent no scenario ran (one that ran has ended)
                finally:
                    for each in pools:
                        each.close()
    return SuiteRun(
        run_plan=run_plan,
        observations={n: observations[n] for n in names},
        torch_distribution=distribution,
        torch_runtime=versions["torch"],
        numpy=versions["numpy"],
    )


def _restart_scenario(run_plan: plan.Plan, names: Sequence[str] | None) -> str | None:
    """The plan's torchrun restart, if it has one among ``names`` (all the plan's if None).
    Before the fixture's probe, ``names`` may hold scenarios only its finding adds."""
    return next(
        (
            s.name
            for s in run_plan.scenarios
            if s.family == "elastic" and (names is None or s.name in names)
        ),
        None,
    )


# How often the main thread wakes while the scenarios run; see :func:`_results`.
SIGNAL_POLL_SECONDS = 0.2


def _results(futures: list[Future[None]]) -> None:
    """Wait for every scenario; raise the first exception one raises, as soon as it does.

    The wait wakes every :data:`SIGNAL_POLL_SECONDS`: the kernel may hand a SIGINT or SIGTERM
    to any thread that does not block it, and Python runs its handler only in the main thread
    (https://docs.python.org/3/library/signal.html#signals-and-threads), which an untimed lock
    wait would leave asleep until a scenario ends, seconds after the interrupt.
    """
    pending: set[Future[None]] = set(futures)
    while pending:
        done, pending = wait(pending, timeout=SIGNAL_POLL_SECONDS, return_when=FIRST_EXCEPTION)
        for future in done:
            future.result()


class FixtureTimeout(Error, RuntimeError):
    """The fixture's first step did not finish in time: a failure, not bad input."""


def _probe_fixture(
    pool: WorkerPool, workdir: Path, fixture: str, run_plan: plan.Plan
) -> plan.AppShape:
    """Build the fixture once at world size 1 and take one step, before any scenario runs; who
    checkpoints its app, whether it has state the tool compares, and what it declares.

    Interface problems are bad input. A fixture whose own code raises is not: the scenarios run
    and fail, showing its traceback (then the plan's shape stands). One that hangs here
    would hang in every scenario.
    """
    workdir.mkdir()
    probe = payloads.FIXTURE_PROBE(
        {
            "fixture": fixture,
            "fixture_args": run_plan.arguments,
            "rank_local": list(run_plan.rank_local),
        }
    )
    outcome = pool.run_group(probe, 1, workdir, "probe")
    record = outcome.results[0] if outcome.results else None
    if outcome.timed_out:
        raise FixtureTimeout(_probe_timeout(fixture, pool.timeout, record))
    if record is not None and record["problem"] is not None:
        raise FixtureProblem(record["problem"])
    if record is None or record["shape"] is None:
        return run_plan.shape
    shape: plan.AppShape = record["shape"]
    return shape


# Names a probe timeout lists of the threads left running; the rest are counted.
SHOWN_THREADS = 8


def _probe_timeout(fixture: str, timeout: float, record: dict[str, Any] | None) -> str:
    """Why the probe timed out, by the phase its record (FixtureProbeRecord) says was under way."""
    head = f"fixture {fixture!r}: timeout:"
    phase = None if record is None else record.get("phase")
    if record is not None and phase == "done":
        threads: list[str] = record["threads"]
        if not threads:
            return (
                f"{head} its first step() returned, but the worker did not exit within "
                f"{timeout:g} s: something the fixture started and the exit waits for (a "
                "multiprocessing child that is not a daemon, a thread started outside Python) "
                "still runs; stop it before step() returns"
            )
        shown = ", ".join(threads[:SHOWN_THREADS])
        more = f" and {len(threads) - SHOWN_THREADS} more" if len(threads) > SHOWN_THREADS else ""
        return (
            f"{head} its first step() returned, but left {len(threads)} non-daemon thread(s) "
            f"running ({shown}{more}), and a worker exits only once those end: they had not "
            f"after {timeout:g} s; make them daemon threads (daemon=True) or stop and join them "
            "before step() returns"
        )
    doing = {
        "build": f"importing it and calling {fixture}(0, 1)",
        "state_dict": "its app's first state_dict()",
        "step": "its app's first step()",
        "state_dict_after_step": "its app's state_dict() after the first step",
    }.get(phase if isinstance(phase, str) else "")
    if doing is None:  # no record: the worker did not reach the fixture
        doing = "starting a worker for it"
    return f"{head} {doing} took more than {timeout:g} s (raise --timeout if that is expected)"


# A loop may print without end: the console shows a few lines of each log, and its traceback
# is at the end, so the end is what is read.
LOG_TAIL_BYTES = 256 << 10


def _logs(ctx: ScenarioContext) -> list[Log]:
    """Read before the workspace goes: the console decides what of them it shows."""
    logs = [Log("", note) for note in ctx.notes]
    for _, outcome in ctx.outcomes:
        logs += [Log(p.name, _tail(p)) for p in outcome.logs if p.exists()]
    return logs


def _tail(path: Path) -> str:
    with open(path, "rb") as log:
        size = log.seek(0, os.SEEK_END)
        log.seek(max(0, size - LOG_TAIL_BYTES))
        data = log.read()
    text = data.decode(errors="replace")
    return text.split("\n", 1)[-1] if size > LOG_TAIL_BYTES else text  # from a whole line


# What a worker's log says when the machine, not the checkpoint, failed it.
_ENVIRONMENT_LOG = re.compile(r"\[Errno (28|122|13|30)\] ([^:\n]+)")


def _refuse_environment_failures(ctx: ScenarioContext) -> None:
    """A full or read-only disk fails every scenario for the same reason: stop the run (exit 2)."""
    for _, outcome in ctx.outcomes:
        match = _ENVIRONMENT_LOG.search(outcome.log_tail())
        if match:
            raise EnvironmentProblem(
                f"a worker failed with {match.group(2)} in the run's workspace under "
                f"{tempfile.gettempdir()}: free space there or point TMPDIR at another directory"
            )


def _probe_release(
    pool: WorkerPool,
    workspace: Path,
    env: release_env.ReleaseEnv,
    fixture: str,
    run_plan: plan.Plan,
) -> None:
    """What the other release's ranks import, not only its interpreter alone (a directory of
    the runner's import path could shadow its torch), and that the fixture resolves there: its
    environment holds torch, NumPy and this package, and nothing else the fixture may need."""
    workdir = workspace / f"probe-{env.release}"
    workdir.mkdir()
    payload: payloads.FixtureImports = {"fixture": fixture, "fixture_args": run_plan.arguments}
    outcome = pool.run_group(payloads.FIXTURE_IMPORTS(payload), 1, workdir, "probe")
    if not outcome.ok or not outcome.results:
        where = (
            f"--resume-with-torch {env.release}: a rank in torch {env.release}'s environment "
            f"({env.directory})"
        )
        if outcome.timed_out:
            # Slow, not broken (a busy machine, a cold disk): the environment stays, for this
            # run's peers sharing the cache and for the next run.
            raise ReleaseEnvError(
                f"{where} did not import torch and resolve the fixture within {pool.timeout:g} "
                "s: give more with --timeout"
            )
        errors = _error_lines(outcome.log_tail())
        said = f": {errors[-1][:200]}" if errors else ""
        # Only a broken installation has the environment made afresh; anything else is said as
        # it is, and the environment kept.
        broken = bool(errors) and _failed_to_load(errors[-1])
        if broken:
            env.forget()
        raise ReleaseEnvError(
            f"{where} exited {outcome.exit_codes}{said}"
            + ("; it is made afresh on the next run" if broken else "")
        )
    theirs = outcome.results[0]
    if theirs["fixture_error"] is not None:
        raise ReleaseEnvError(
            f"--resume-with-torch {env.release}: in torch {env.release}'s environment (torch, "
            f"NumPy and dcp-invariant only), {theirs['fixture_error']}"
        )
    if theirs["torch"] != env.torch:
        raise ReleaseEnvError(
            f"--resume-with-torch {env.release}: its ranks import torch {theirs['torch']}, not "
            f"the environment's {env.torch}: a directory on your import path (PYTHONPATH, a "
            ".pth file) holds another torch; run without it"
        )


def _probe(pool: WorkerPool, workdir: Path) -> dict[str, str]:
    """torch.__version__ and NumPy's version, read in a worker: the runner must not import torch.

    On the spawn path the next standby says what it imported, which costs no interpreter. A
    forked probe job reads them otherwise, and also where a standby lacks one: its log then
    names what could not be imported.
    """
    try:
        imported = pool.imported_versions()
    except StandbyFailed as exc:
        raise WorkerStartError([] if exc.exit_code is None else [exc.exit_code], "") from None
    if imported is not None and None not in imported.values():
        return {name: str(version) for name, version in imported.items()}
    workdir.mkdir()
    outcome = pool.run_group(payloads.RUNTIME_VERSIONS({}), 1, workdir, "probe")
    if not outcome.ok or not outcome.results:
        raise WorkerStartError(outcome.exit_codes, outcome.log_tail())
    result: dict[str, str] = outcome.results[0]
    return result
