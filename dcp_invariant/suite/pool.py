"""Launching groups of fresh worker processes, each with a deadline, always reaped.

Process start-up dominates the suite: a worker imports torch, DCP and torch._dynamo, about 3 s
of CPU here. On Linux a fork server that has preloaded them hands out fresh processes in
milliseconds; they share no training state with anything, which is what a resume test needs
from "fresh". Where there is no fork server (Windows), or forking a process that loaded system
frameworks is unsafe (macOS: CPython defaults to spawn there for that reason), workers are
spawned interpreters that were started ahead, imported torch while other scenarios ran, and
take exactly one job each.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import multiprocessing.connection
import multiprocessing.util
import os
import signal
import subprocess
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from dcp_invariant import canonical, torch_first_use
from dcp_invariant.errors import Error, StartMethodError
from dcp_invariant.evidence.families.records import GroupRecord, RaisedRecord
from dcp_invariant.suite import fixture_imports, reaper, worker

if TYPE_CHECKING:  # scenarios/ imports this module: the import is for mypy alone
    from dcp_invariant.suite.scenarios.payloads import Call

# What workers import, including what torch imports lazily on first use
# (:mod:`dcp_invariant.torch_first_use`). A module missing from another torch release is
# skipped by the fork server.
PRELOAD = [
    "dcp_invariant.ranks.tasks",
    "dcp_invariant.ranks.fixture_tasks",
    "dcp_invariant.suite.registered_fixture",
    *torch_first_use.MODULES,
]
# How many spawned workers wait, imported and idle, for their one job. Imports keep both cores
# busy either way, and each idle one left at the end is ~3 s of CPU spent for nothing.
# Measured (registered suite, spawn path, one sitting): 0, 1 and 2 standbys took 33.5-34.7,
# 33.8 and 34.8 s; 3 were slower still in an earlier sitting.
STANDBY = 1
START_METHOD_ENV = "DCP_INVARIANT_START_METHOD"
START_METHODS = ("forkserver", "spawn")
# After the first rank fails, how long the others get to notice before they are killed.
FAILURE_GRACE_SECONDS = 10.0
# An interrupt must leave no process within 2 s: how long a killed process gets to be reaped.
CANCEL_GRACE_SECONDS = 1.0


@dataclass
class GroupOutcome:
    exit_codes: list[int]
    timed_out: bool
    results: list[dict[str, Any]]
    logs: list[Path]
    # Programs the group's processes left running, killed when it ended (:func:`reap_group`).
    stragglers: list[str] = field(default_factory=list)
    # What the user's code raised on the ranks it ended (worker.raised_record).
    raised: list[RaisedRecord] = field(default_factory=list)
    # The ranks whose process ended before their task returned (worker.unfinished).
    unfinished: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(code == 0 for code in self.exit_codes)

    def record(self) -> GroupRecord:
        record: GroupRecord = {
            "exit_codes": self.exit_codes,
            "timed_out": self.timed_out,
            "ranks": self.results,
        }
        # Omitted when empty: the records of passing runs are unchanged.
        if self.raised:
            record["raised"] = self.raised
        if self.unfinished:
            record["unfinished"] = self.unfinished
        return record

    def log_tail(self, lines: int = 20) -> str:
        out = []
        for path in self.logs:
            text = path.read_text(errors="replace").splitlines() if path.exists() else []
            if text:  # an empty log says nothing; its header alone would only be noise
                out.append(f"--- {path.name}\n" + "\n".join(text[-lines:]))
        return "\n".join(out)


class Cancelled(Exception):
    """The run is being interrupted: no new group starts."""


class StandbyFailed(Error, RuntimeError):
    """A spawned standby ended before it could say what it imported."""

    def __init__(self, exit_code: int | None) -> None:
        self.exit_code = exit_code
        super().__init__(f"a spawned worker ended while importing (exit code {exit_code})")


def available_start_methods() -> tuple[str, ...]:
    """The start methods of START_METHODS this platform has: Windows has only spawn."""
    return tuple(m for m in START_METHODS if m in multiprocessing.get_all_start_methods())


def start_method() -> str:
    """The fork server on Linux, spawned standbys elsewhere or where this process already runs a
    fork server (:func:`server_of_others`); ``DCP_INVARIANT_START_METHOD`` forces one."""
    forced = os.environ.get(START_METHOD_ENV, "")
    if forced:
        if forced not in START_METHODS:
            raise StartMethodError(
                f"{START_METHOD_ENV}={forced!r}: use one of {', '.join(START_METHODS)} or unset it"
            )
        if forced not in available_start_methods():
            raise StartMethodError(f"{START_METHOD_ENV}={forced!r}: this platform has no {forced}")
        return forced
    return "forkserver" if sys.platform == "linux" and not server_of_others() else "spawn"


def server_of_others() -> bool:
    """Whether this process already has a multiprocessing fork server, which a run did not
    start (a run stops its own as it ends): the caller's, Python 3.14's default start method.

    It is the process's one server (``_forkserver`` in multiprocessing/forkserver.py), which
    ``ensure_running()`` would hand this run as it is: without the run's environment, token
    and preloaded torch, and then stopped under its owner. The spawn path is used instead.
    """
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver
    return server._forkserver_pid is not None


@dataclass
class _Standby:
    """A spawned worker waiting for its one job, and its two pipes."""

    process: Any
    jobs: Any  # the job goes down this one
    ready: Any  # what it imported comes up this one

    def close(self) -> None:
        self.jobs.close()
        self.ready.close()


class _Launcher(Protocol):
    """How a start method gives the pool its fresh processes (:func:`start_method` picks one).

    Every method is called with the pool's lock held but :meth:`imported_versions`, which takes
    it itself: the pool's other threads must not wait on a standby's imports.
    """

    def start(self, workdir: Path) -> None: ...

    def launch(self, jobs: list[worker.Job]) -> list[Any]:
        """One fresh, started process for each job."""
        ...

    def imported_versions(self) -> dict[str, str | None] | None: ...

    def wind_down(self) -> None: ...

    def stop_idle(self) -> None:
        """Stop what waits for no job (an interrupt, or the end of the run)."""
        ...

    def close(self) -> None: ...


@contextlib.contextmanager
def caller_main_hidden() -> Iterator[None]:
    """While the run starts processes, its caller's ``__main__`` is not theirs to run.

    multiprocessing gives every process it starts (spawned, or forked by the fork server) the
    parent's main module to run again as ``__mp_main__``: the module of ``__spec__.name``, else
    the file ``__main__.__file__`` names (``get_preparation_data`` and ``prepare`` in
    multiprocessing/spawn.py). A script that calls ``check()`` without an ``if __name__ ==
    "__main__":`` guard would then run its check again in every worker, and one read from
    standard input fails on the file ``<stdin>``. Workers run only this package's tasks on
    fixtures named by module, so for the run ``sys.modules["__main__"]`` is a bare module that
    names neither: nothing of the caller's is run again, on the fork-server and the spawn path.
    Runs that overlap in threads share one stand-in, and the last to end puts the caller's
    module back.
    """
    global _hidden_main, _hiding
    with _hiding_lock:
        if _hiding == 0:
            _hidden_main = sys.modules.get("__main__")
            sys.modules["__main__"] = types.ModuleType("__main__")
        _hiding += 1
    try:
        yield
    finally:
        with _hiding_lock:
            _hiding -= 1
            if _hiding == 0:
                if _hidden_main is None:
                    sys.modules.pop("__main__", None)
                else:
                    sys.modules["__main__"] = _hidden_main
                _hidden_main = None


_hiding_lock = threading.Lock()
_hiding = 0  # runs under caller_main_hidden now
_hidden_main: types.ModuleType | None = None


@contextlib.contextmanager
def one_run_at_a_time() -> Iterator[None]:
    """A run holds this for its whole length; a run started meanwhile in another thread of
    this process waits for it to end, then runs (both get their own verdict).

    What a run starts is process-wide: multiprocessing has one fork server and one resource
    tracker per process (``_forkserver`` in multiprocessing/forkserver.py, ``_resource_tracker``
    in multiprocessing/resource_tracker.py), started with the environment of the run that
    started them, its token included (:class:`reaper.Guardian` sets it in ``os.environ``), and
    every worker forked carries that environment. Two runs at once shared one server: the first
    to end swept or stopped it under the other, whose ranks then exited with 255 or whose next
    launch raised EOFError. And ``Process.start()`` reads the exit code of every live child of
    the interpreter (``multiprocessing.process._cleanup``), which one pool's lock cannot guard
    from another's (:func:`_wait`). Reentrant: ``check()`` holds it around its guardian and
    the suite takes it again inside.
    """
    with _run_gate:
        yield


_run_gate = threading.RLock()


def _new_gate() -> None:
    global _run_gate
    _run_gate = threading.RLock()


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    # A process forked while another thread ran a check inherits the gate held by a thread it
    # does not have: its own check would wait for ever.
    os.register_at_fork(after_in_child=_new_gate)


class _ForkServer:
    """Linux: each worker forked by multiprocessing's fork server, which preloaded torch."""

    def __init__(self, ctx: Any, fixture: str | None, timeout: float) -> None:
        self._ctx = ctx
        self._fixture = fixture
        self._timeout = timeout
        self._started = False  # whether this run started the process's fork server

    def start(self, workdir: Path) -> None:
        from multiprocessing import forkserver

        server: Any = forkserver._forkserver  # its private members are read: typeshed has none
        if server_of_others():
            # start_method() chose spawn for a server someone else started; forced, it is this.
            raise StartMethodError(
                f"{START_METHOD_ENV}=forkserver: this process already runs a multiprocessing "
                "fork server that dcp-invariant did not start: unset it (spawn is used then)"
            )
        isolated = worker.isolated_environment(workdir)
        isolated[worker.PARENT_PID_ENV] = str(os.getpid())  # read and dropped by .fork_server
        if self._fixture is not None:
            given = fixture_imports.preload(
                self._fixture, sys.path, self._timeout, str(workdir / "libraries.log")
            )
            if given is not None:
                isolated[fixture_imports.LIBRARIES_ENV] = given.encode()  # and this
        saved = {key: os.environ.get(key) for key in isolated}
        os.environ.update(isolated)
        # The preload list is the process's too, read only when a server starts: it is this
        # run's for that moment, and the caller's again for any server the caller starts later.
        preload = server._preload_modules
        try:
            # It imports PRELOAD and the fixture's libraries itself (.fork_server).
            self._ctx.set_forkserver_preload(["dcp_invariant.suite.fork_server"])
            with worker.interrupts_held():
                forkserver.ensure_running()
        finally:
            # No server ran before (server_of_others): one running now is this run's.
            self._started = server._forkserver_pid is not None
            self._ctx.set_forkserver_preload(preload)
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def launch(self, jobs: list[worker.Job]) -> list[Any]:
        procs = [
            self._ctx.Process(
                target=worker.start_in_workspace,
                args=(job,),
                name=f"dcp-invariant-{job.group}-{job.rank}",
                daemon=False,
            )
            for job in jobs
        ]
        for proc in procs:
            proc.start()
        return procs

    def imported_versions(self) -> None:
        return None  # a probe job costs a fork: the runner sends one

    def wind_down(self) -> None:
        pass  # nothing is started ahead

    def stop_idle(self) -> None:
        pass  # the server forks on demand: nothing idles

    def close(self) -> None:
        # The server this run started carries its token, so the run's sweep has killed it: stop
        # it (reap it, forget its socket) so that the next run starts its own, and an in-process
        # caller (a test) is left with no zombie. _stop() is what CPython's own tests use.
        if self._started:
            from multiprocessing import forkserver

            self._started = False
            server: Any = forkserver._forkserver
            server._stop()


class _Standbys:
    """Elsewhere: spawned interpreters started ahead, each taking one job once imported."""

    def __init__(
        self,
        ctx: Any,
        lock: threading.Lock,
        timeout: float,
        refuse_if_cancelled: Callable[[], None],
    ) -> None:
        self._ctx = ctx
        # The pool's: its lock (held around every call but imported_versions), how long a
        # standby may take to import, and what raises once the run is being interrupted.
        self._lock = lock
        self._timeout = timeout
        self._refuse_if_cancelled = refuse_if_cancelled
        self._standby: list[_Standby] = []  # idle spawned workers, oldest first
        self._home: Path | None = None
        self._keep = STANDBY  # idle standbys to keep; 0 once no scenario is left to start

    def start(self, workdir: Path) -> None:
        self._home = workdir
        self._refill(first_standbys(usable_cores()))

    def launch(self, jobs: list[worker.Job]) -> list[Any]:
        """Give each job to its own standby (starting more if too few wait), then refill."""
        self._refill(len(jobs))
        taken, self._standby = self._standby[: len(jobs)], self._standby[len(jobs) :]
        for standby, job in zip(taken, jobs, strict=True):
            standby.jobs.send(job)
            standby.close()
        self._refill(self._keep)
        return [standby.process for standby in taken]

    def imported_versions(self) -> dict[str, str | None]:
        """torch's and NumPy's versions as the next standby imported them.

        Reading them uses nothing up: the standby still takes a job of its own later, so the
        check before any scenario costs no interpreter.
        """
        with self._lock:
            self._refuse_if_cancelled()
            self._refill(1)
            proc, conn = self._standby[0].process, self._standby[0].ready
        try:
            ready = conn.poll(self._timeout)  # waiting for the imports, without the lock
            versions: dict[str, str | None] = conn.recv() if ready else {}
        except (EOFError, OSError):
            self._refuse_if_cancelled()  # cancel() closed the pipe: an interrupt, not a failure
            with self._lock:
                proc.join(CANCEL_GRACE_SECONDS)
                raise StandbyFailed(proc.exitcode) from None
        if not ready:
            raise StandbyFailed(None)
        return versions

    def wind_down(self) -> None:
        self._keep = 0

    def stop_idle(self) -> None:
        """Idle standbys have no job: closing their pipe ends them; kill any still importing."""
        for standby in self._standby:
            standby.close()
            standby.process.kill()
        for standby in self._standby:
            standby.process.join(CANCEL_GRACE_SECONDS)
        self._standby = []

    def close(self) -> None:
        self.stop_idle()

    def _refill(self, count: int) -> None:
        """Start standbys up to ``count`` idle ones."""
        assert self._home is not None, "start() the pool first"
        while len(self._standby) < count:
            # Two one-way pipes, not one duplex socket: on one socket, once the pool has sent a
            # job and closed its end, the standby's own message fails with a reset, and a closed
            # pool reads as a reset instead of an end of file; apart, each side's end is clean.
            job_reader, job_writer = self._ctx.Pipe(duplex=False)
            ready_reader, ready_writer = self._ctx.Pipe(duplex=False)
            proc = self._ctx.Process(
                target=worker.standby,
                args=(
                    job_reader,
                    ready_writer,
                    os.getpid(),
                    str(self._home),
                    PRELOAD,
                    # A spawned interpreter chooses its own; it gets the runner's, which is short.
                    multiprocessing.util.get_temp_dir(),
                ),
                name="dcp-invariant-standby",
                daemon=False,
            )
            with worker.interrupts_held():
                proc.start()
            job_reader.close()
            ready_writer.close()
            self._standby.append(_Standby(proc, job_writer, ready_reader))


def _pidfd_works() -> bool:
    """Whether this kernel gives pidfds (Linux 5.3; a seccomp profile may refuse the call)."""
    if sys.platform != "linux":
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


_PIDFD = _pidfd_works()


class _FreshProcess:
    """A rank started as ``python -m dcp_invariant.suite.fresh_interpreter``, with the members
    :func:`_wait` and :meth:`WorkerPool.run_group` read of a ``multiprocessing.Process``."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        # POSIX without pidfds: a pipe whose write end only the child holds, readable once it
        # has ended, as multiprocessing's own sentinel (multiprocessing/popen_fork.py).
        use_pipe = sys.platform != "win32" and not _PIDFD
        read_end, write_end = os.pipe() if use_pipe else (-1, -1)
        try:
            self._proc = subprocess.Popen(
                command,
                env=env,
                stdin=subprocess.DEVNULL,
                pass_fds=() if write_end < 0 else (write_end,),
            )
        except BaseException:
            if read_end >= 0:
                os.close(read_end)
            raise
        finally:
            if write_end >= 0:
                os.close(write_end)
        self.pid = self._proc.pid
        fd = read_end
        if sys.platform == "win32":  # the process handle is waitable itself
            self.sentinel: int = int(self._proc._handle)  # type: ignore[attr-defined]
        elif sys.platform == "linux" and _PIDFD:
            # Linux: readable when the process itself ends, whatever its own children (a
            # DataLoader's forked workers) still hold open: a pipe would wait for them too.
            try:
                fd = self.sentinel = os.pidfd_open(self.pid)
            except BaseException:
                self._proc.kill()  # started, and nothing could wait for it: not left running
                self._proc.wait()
                raise
        else:
            self.sentinel = read_end
        # Closed by close(), or when the object goes (a group cut short by an interrupt).
        self._close = weakref.finalize(self, os.close, fd) if fd >= 0 else None

    @property
    def exitcode(self) -> int | None:
        return self._proc.poll()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self._proc.kill()

    def join(self, timeout: float | None = None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout)

    def close(self) -> None:
        if self._close is not None:
            self._close()


# What another environment's interpreter must not inherit: the runner's import path and home.
_NOT_PASSED_ON = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONEXECUTABLE")


class _Interpreters:
    """Another environment's interpreter (another torch release's): each rank a fresh process of
    it, importing that environment's torch; nothing is started ahead."""

    def __init__(self, python: Path, search_path: list[str]) -> None:
        self._python = python
        self._search_path = search_path

    def start(self, workdir: Path) -> None:
        pass  # each rank is started when its group is: nothing to start ahead

    def launch(self, jobs: list[worker.Job]) -> list[Any]:
        # The environment's own interpreter and paths; the user's other settings (their
        # PYTHONHASHSEED, say) as the runner's ranks have them.
        env = {k: v for k, v in os.environ.items() if k not in _NOT_PASSED_ON}
        env["PYTHONPATH"] = os.pathsep.join(self._search_path)
        env[worker.PARENT_PID_ENV] = str(os.getpid())
        if sys.platform != "win32":  # Windows' multiprocessing makes no AF_UNIX sockets
            env[worker.MULTIPROCESSING_TEMP_ENV] = multiprocessing.util.get_temp_dir()
        procs: list[_FreshProcess] = []
        try:
            with worker.interrupts_held():
                for job in jobs:
                    fields = {**job.__dict__, "payload": dict(job.payload)}
                    # -P: no current directory ahead of PYTHONPATH, whose first entry is this
                    # package's copy (the search path adds the directory where it is safe).
                    command = [
                        str(self._python),
                        "-P",
                        "-m",
                        "dcp_invariant.suite.fresh_interpreter",
                    ]
                    procs.append(_FreshProcess([*command, json.dumps(fields)], env))
        except BaseException:
            for proc in procs:  # a group starts whole or not at all
                proc.kill()
                proc.join()
                proc.close()
            raise
        return procs

    def imported_versions(self) -> None:
        return None

    def wind_down(self) -> None:
        pass

    def stop_idle(self) -> None:
        pass

    def close(self) -> None:
        pass


def first_standbys(cores: int) -> int:
    """How many standbys the spawn path starts with on ``cores``: nothing else runs yet, and the
    probe waits for the first standby's imports; one per core keeps every core importing for
    the first scenarios meanwhile, up to the four the registered suite's first two scenarios
    take (two workers each)."""
    return max(STANDBY, min(cores, 4))


def usable_cores() -> int:
    """The cores this process may run on (its affinity, where the OS has one), at least one."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


class WorkerPool:
    def __init__(
        self,
        timeout: float,
        method: str | None = None,
        *,
        python: Path | None = None,
        search_path: list[str] | None = None,
        fixture: str | None = None,
    ) -> None:
        """``python``: run every rank in that interpreter instead (another environment's), with
        ``search_path`` as its PYTHONPATH. ``fixture``: the fork server also imports the
        libraries its module imports (:mod:`.fixture_imports`)."""
        self.timeout = timeout
        self.cancelled = False
        self._lock = threading.Lock()
        self._live: set[Any] = set()  # started worker processes and the torchrun agent
        self.method = method or start_method()
        # The resource tracker's PID before this pool started anything (:func:`_end_tracker`).
        self._tracker_before: int | None = _tracker()._pid
        ctx = multiprocessing.get_context(self.method)
        self._launcher: _Launcher = (
            _Interpreters(python, search_path or [])
            if python is not None
            else _ForkServer(ctx, fixture, timeout)
            if self.method == "forkserver"
            else _Standbys(ctx, self._lock, timeout, self._refuse_if_cancelled)
        )

    def start(self, workdir: Path) -> None:
        """Start the fork server, or the first standbys, with their home and temp directory
        inside ``workdir``.

        Importing torch._dynamo creates ``$TMPDIR/torchinductor_<user>``; the workers' imports
        must leave nothing outside the run's workspace. The fork server copies ``os.environ``
        when it starts, so the environment is swapped only around that moment, before any
        scenario thread exists.
        """
        workdir.mkdir()
        for sub in ("home", "tmp"):
            (workdir / sub).mkdir()
        with self._lock:
            self._launcher.start(workdir)

    def idle_cores(self) -> int:
        """The cores this machine lets the run use that the pool's start leaves idle: it
        imports torch in one fork server, or in a standby per core (up to four)."""
        cores = usable_cores()
        if isinstance(self._launcher, _Standbys):
            return max(0, cores - first_standbys(cores))
        return cores - 1

    def run_group(self, call: Call, world_size: int, workdir: Path, group: str) -> GroupOutcome:
        """Run ``call``'s task on ``world_size`` fresh ranks, each given its payload as it is."""
        worker.prepare_workdir(workdir)
        self._refuse_if_cancelled()
        jobs = [
            worker.Job(call.task, rank, world_size, str(workdir), group, call.payload, self.timeout)
            for rank in range(world_size)
        ]
        # Not daemonic: a worker may start processes of its own (async_save's process mode
        # does), which multiprocessing refuses a daemon. Every worker is reaped or killed here
        # (and dies with its parent, worker.die_with_parent), so nothing needs the flag.
        with self._lock:
            # Again under the lock cancel() takes: a group must not start after its snapshot.
            self._refuse_if_cancelled()
            procs = self._launcher.launch(jobs)
            self._live.update(procs)
        try:
            timed_out = _wait(procs, self.timeout, self._lock)
        finally:
            with self._lock:
                self._live.difference_update(procs)
        self._refuse_if_cancelled()
        stragglers = reap_group(workdir, group, {p.pid for p in procs})
        stragglers = sorted(stragglers + worker.stragglers(workdir, group, world_size))
        results = []
        for rank in range(world_size):
            path = workdir / worker.result_path(group, rank)
            if path.exists():
                results.append(canonical.loads(path.read_bytes(), what=path.name))
        with self._lock:
            exit_codes = [int(p.exitcode) for p in procs]
            for proc in procs:
                proc.close()
        return GroupOutcome(
            exit_codes=exit_codes,
            timed_out=timed_out,
            results=results,
            logs=[workdir / worker.log_path(group, r) for r in range(world_size)],
            stragglers=stragglers,
            raised=worker.raised(workdir, group, world_size),
            # Only those that exited 0: a non-zero code says already that the task failed, and
            # the registered suite's evidence of a rank killed on purpose stays as it was.
            unfinished=[]
            if timed_out
            else [r for r in worker.unfinished(workdir, group, world_size) if exit_codes[r] == 0],
        )

    def imported_versions(self) -> dict[str, str | None] | None:
        """torch's and NumPy's versions as the next spawned standby imported them; None on the
        fork-server path, where a probe job costs a fork."""
        return self._launcher.imported_versions()

    def wind_down(self) -> None:
        """Every scenario has started: keep no more standbys (the last would be wasted imports);
        the groups still to come spawn their workers when they ask."""
        with self._lock:
            self._launcher.wind_down()

    def track(self, proc: subprocess.Popen[bytes]) -> None:
        """Let :meth:`cancel` reach a process the pool did not start itself (the torchrun agent)."""
        with self._lock:
            self._refuse_if_cancelled()
            self._live.add(proc)

    def untrack(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._live.discard(proc)

    def cancel(self) -> None:
        """Kill every live worker and agent now, and start nothing more; safe from any thread.

        Forked workers die with their fork server and torchrun's workers with their agent
        (:func:`worker.die_with_parent`), so killing these is enough to leave no process.
        """
        with self._lock:
            self.cancelled = True
            live = list(self._live)
            self._launcher.stop_idle()
        for proc in live:
            if isinstance(proc, subprocess.Popen):
                kill_process_tree(proc)
            elif proc.exitcode is None:
                proc.kill()
        for proc in live:
            if isinstance(proc, subprocess.Popen):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=CANCEL_GRACE_SECONDS)
            else:
                proc.join(CANCEL_GRACE_SECONDS)

    def _refuse_if_cancelled(self) -> None:
        if self.cancelled:
            raise Cancelled("the run is being interrupted")

    def close(self) -> None:
        with self._lock:
            self._launcher.close()
            _end_tracker(self._tracker_before)


def _tracker() -> Any:
    """This process's one resource tracker (``_resource_tracker`` in
    multiprocessing/resource_tracker.py), which starting a worker starts if none runs."""
    from multiprocessing import resource_tracker

    return resource_tracker._resource_tracker


def _end_tracker(before: int | None) -> None:
    """Reap the resource tracker this pool started, once the run's sweep killed it.

    Started with the run's token in its environment, it is killed with the run's processes;
    left so (the spawn path did), the next run's first process found it dead, relaunched one
    and warned "resource_tracker: process died unexpectedly". ``_pid`` is set only where this process
    started a tracker: it is None for the one a spawned or forked child shares with its parent
    (``spawn_main`` in multiprocessing/spawn.py, ``_serve_one`` in
    multiprocessing/forkserver.py), whose ``_stop()`` raised TypeError waiting for no PID, and
    closed the child's only way to it. One this run started that still runs (no sweep where
    there is no /proc, or no guardian's token in it) is stopped too: closing its pipe ends it
    (``_stop``), and a later user of multiprocessing in this process starts another.
    """
    tracker = _tracker()
    if tracker._pid not in (None, before):
        tracker._stop()


def reap_group(workdir: Path, group: str, sessions: set[int]) -> list[str]:
    """Kill what a finished group left running; the programs' names, for a warning.

    Its workers led ``sessions`` (:func:`worker.leave_terminal_session`) and put the group's
    token in their environment, so whatever they started is found even in another session.
    multiprocessing's own resource tracker is killed but not named: it leaves by itself once
    its clients have.
    """
    mark = reaper.group_mark(os.path.realpath(workdir), group)
    killed = reaper.kill_all(lambda: reaper.of_group(mark, sessions))
    return [s.name for s in killed if not s.helper]


def kill_process_tree(proc: subprocess.Popen[bytes]) -> None:
    """Kill a process started in its own session or process group, with what it started.

    On POSIX the whole process group goes. torch's elastic agent starts each worker in a session
    of its own (``start_new_session=True`` in
    ``torch/distributed/elastic/multiprocessing/subprocess_handler/subprocess_handler.py``), so
    those die through their parent-death signal instead. Windows has no process groups to
    signal: ``taskkill /T`` walks the tree.
    """
    if sys.platform == "win32":
        subprocess.run(
            ["taskkill", "/F", "/T", "/PID", str(proc.pid)],
            check=False,
            capture_output=True,
            timeout=60,
        )
        return
    with contextlib.suppress(ProcessLookupError):  # nothing left in the group
        os.killpg(proc.pid, signal.SIGKILL)


def _wait(procs: list[Any], timeout: float, lock: threading.Lock) -> bool:
    """Join ``procs``; kill them all at the deadline (True) or soon after the first one fails.

    A rank killed because a peer failed shows as a negative exit code, not as a timeout.

    Every read of an exit code holds ``lock``, the one :meth:`WorkerPool.run_group` starts
    processes under: ``Process.start()`` polls every live child of this interpreter
    (``multiprocessing.process._cleanup``), and a fork server child's exit code is a message
    on its sentinel that only one reader gets; a second, concurrent reader sees the pipe's end
    and records 255 (``multiprocessing/popen_forkserver.py``, ``Popen.poll``).
    """
    deadline = time.monotonic() + timeout
    kill_at = deadline
    while True:
        with lock:
            codes = [p.exitcode for p in procs]
        alive = [p for p, code in zip(procs, codes, strict=True) if code is None]
        if not alive:
            return False
        now = time.monotonic()
        if any(code not in (None, 0) for code in codes):
            kill_at = min(kill_at, now + FAILURE_GRACE_SECONDS)
        if now >= kill_at:
            with lock:
                for p in alive:
                    p.kill()
            # Reaped without the lock, which cancel() takes and must get at once; reading the
            # exit codes of the ended processes then takes it for a moment only.
            for p in alive:
                multiprocessing.connection.wait([p.sentinel])
            with lock:
                for p in alive:
                    p.join()
            return now >= deadline
        # Waiting for a sentinel to become readable consumes nothing: no lock needed.
        multiprocessing.connection.wait(
            [p.sentinel for p in alive], timeout=min(0.5, kill_at - now)
        )
