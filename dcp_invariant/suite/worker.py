"""What every fresh worker process does first: isolate itself, join its group, run one task.

A worker is forked from a server that preloaded torch (or spawned, or started by torchrun);
none of them carries training state, so each is fresh for resume purposes. Results go to a
canonical JSON file per rank, rewritten atomically after each phase, so a rank that dies
mid-task still leaves what it finished.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import multiprocessing
import os
import signal
import socket
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn, cast

from dcp_invariant import canonical
from dcp_invariant.commit import durable
from dcp_invariant.errors import AppRaised
from dcp_invariant.evidence.families.records import RaisedRecord
from dcp_invariant.plan import AppMethod
from dcp_invariant.suite import fixture, reaper

Reporter = Callable[[dict[str, Any]], None]
Task = Callable[[int, int, dict[str, Any], Reporter], None]


def result_path(group: str, rank: int) -> str:
    return f"results/{group}-rank{rank}.json"


def stragglers_path(group: str, rank: int) -> str:
    """Programs a rank's loop left running, one a line, killed when its task ended."""
    return f"results/{group}-rank{rank}.left"


def _written(
    workdir: Path, group: str, world_size: int, path_of: Callable[[str, int], str]
) -> dict[int, Path]:
    """The group's ranks that wrote their file named by ``path_of``, with its path."""
    found = {rank: workdir / path_of(group, rank) for rank in range(world_size)}
    return {rank: path for rank, path in found.items() if path.exists()}


def stragglers(workdir: Path, group: str, world_size: int) -> list[str]:
    """What the group's ranks reported leaving running (:func:`stragglers_path`)."""
    written = _written(workdir, group, world_size, stragglers_path).values()
    return [name for path in written for name in path.read_text(errors="replace").split()]


def raised_path(group: str, rank: int) -> str:
    """What the user's code raised on a rank, which ended it (:func:`raised`)."""
    return f"results/{group}-rank{rank}.raised"


def raised(workdir: Path, group: str, world_size: int) -> list[RaisedRecord]:
    """Each rank's record of what the user's code raised and where, for the ranks it ended."""
    records: list[RaisedRecord] = []
    for path in _written(workdir, group, world_size, raised_path).values():
        record: RaisedRecord = canonical.loads(path.read_bytes(), what=path.name)
        records.append(record)
    return records


def raised_record(rank: int, exc: AppRaised) -> RaisedRecord:
    """Where the user's code raised and the type it raised; never the message, which may hold
    paths."""
    # AppRaised is made by fixture.users_code alone, whose method is a plan.AppMethod.
    method = cast(AppMethod, exc.method)
    return {"exception": type(exc.error).__name__, "method": method, "rank": rank}


def finished_path(group: str, rank: int) -> str:
    """Written once a rank's task has returned: a process that ended without it (os._exit in
    the loop, a kill) did not finish, whatever its exit code."""
    return f"results/{group}-rank{rank}.finished"


def unfinished(workdir: Path, group: str, world_size: int) -> list[int]:
    """The ranks whose task neither returned nor ended in the user's exception (:func:`raised`)."""
    ended = (
        _written(workdir, group, world_size, finished_path).keys()
        | _written(workdir, group, world_size, raised_path).keys()
    )
    return [rank for rank in range(world_size) if rank not in ended]


def log_path(group: str, rank: int) -> str:
    return f"logs/{group}-rank{rank}.log"


def prepare_workdir(workdir: Path) -> None:
    """The directories a worker whose working directory is ``workdir`` writes into."""
    for sub in ("results", "logs", "pg", "home", "tmp"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)


def isolated_environment(workdir: Path) -> dict[str, str]:
    """Variables that keep a worker's home, temp files and sockets inside its scenario."""
    env = {
        "HOME": str(workdir / "home"),
        "USERPROFILE": str(workdir / "home"),
        "TMPDIR": str(workdir / "tmp"),
        "TMP": str(workdir / "tmp"),
        "TEMP": str(workdir / "tmp"),
        "OMP_NUM_THREADS": "1",
    }
    loopback = loopback_interface()
    if loopback is not None:
        # Gloo binds the address its hostname resolves to unless told which interface to use.
        env["GLOO_SOCKET_IFNAME"] = loopback
    return env


def loopback_interface() -> str | None:
    if not hasattr(socket, "if_nameindex"):
        return None
    for _, name in socket.if_nameindex():
        if name in ("lo", "lo0"):
            return name
    return None


def loopback_gloo_options() -> Any:
    """Gloo options whose one device binds 127.0.0.1, on every platform.

    Gloo otherwise binds the address the host name resolves to, unless GLOO_SOCKET_IFNAME names
    an interface, and interface names differ per OS (``lo``, ``lo0``, and on Windows names like
    ``loopback_0``). ``ProcessGroupGloo.create_device(hostname=...)`` binds an address instead
    (torch/csrc/distributed/c10d/ProcessGroupGloo.cpp). None where this torch lacks the options
    type: GLOO_SOCKET_IFNAME from :func:`isolated_environment` then applies.

    Read in torch 2.13.0 and 2.15.0: ``init_process_group`` and ``new_group`` do not pass
    ``pg_options`` on to a Gloo backend (``_new_process_group_helper`` and
    ``_create_gloo_process_group`` in torch/distributed/distributed_c10d.py build it from the
    store, ranks and timeout alone), so there GLOO_SOCKET_IFNAME is what binds loopback, and on
    Windows, which has no ``lo``, Gloo binds the host name's address. Kept for a torch that
    passes them on; only a Windows run can show what Gloo binds there.
    """
    from torch._C._distributed_c10d import ProcessGroupGloo

    options_type = getattr(ProcessGroupGloo, "_Options", None)
    if options_type is None:
        return None
    options = options_type()
    options._devices = [ProcessGroupGloo.create_device(hostname="127.0.0.1")]
    return options


# The PID that started a subprocess the suite launches (the torchrun agent, its ranks), set by
# that parent in the child's environment.
PARENT_PID_ENV = "DCP_INVARIANT_PARENT_PID"
# The runner's multiprocessing directory, for workers that are fresh interpreters (torchrun's).
MULTIPROCESSING_TEMP_ENV = "DCP_INVARIANT_MULTIPROCESSING_TEMP"


def die_with_parent(parent: int | None = None) -> None:
    """Have the kernel kill this process when its parent dies (Linux: ``PR_SET_PDEATHSIG``).

    A runner killed with SIGKILL runs no cleanup: its fork server then exits (it watches a pipe
    to the runner), and this makes the workers it forked follow; the same holds for torchrun's
    agent and its workers, which it starts in sessions of their own. Elsewhere there is no such
    call; a worker's collectives then time out on their own.

    A parent that died before the call has already handed this process to another: PID 1, or a
    subreaper with any PID (``PR_SET_CHILD_SUBREAPER``, as container runtimes and CI agents
    set). So the parent is compared with the one that started it: ``parent``, or
    ``$DCP_INVARIANT_PARENT_PID``; only when neither is known is PID 1 taken as the sign (a
    runner that is itself PID 1, in a container without an init, must pass its PID).
    """
    if sys.platform != "linux":
        return
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    if parent is None and os.environ.get(PARENT_PID_ENV, "").isdigit():
        parent = int(os.environ[PARENT_PID_ENV])
    current = os.getppid()
    orphaned = current != parent if parent is not None else current == 1
    if orphaned:
        os._exit(1)  # the parent died before the call: follow it now


def run(
    task: str, rank: int, world_size: int, group: str, payload: dict[str, Any], timeout: float
) -> None:
    """Entry point of a worker whose working directory is its scenario's workspace.

    ``timeout`` bounds every collective, so a rank whose peer vanished fails instead of hanging.
    """
    die_with_parent()
    workdir = Path.cwd()
    leave_terminal_session()
    # What this worker's loop starts and abandons (a double fork, a detached daemon) is handed
    # to it instead of to init, so it is found and killed when the task ends.
    reaper.become_subreaper()
    use_platform_start_method()
    adopt_multiprocessing_temp_dir()
    os.environ.update(isolated_environment(workdir))
    # What this worker starts carries its group's token, so the pool finds it when the group
    # ends, whatever session it moved to (:mod:`.reaper`).
    os.environ[reaper.GROUP_ENV] = reaper.group_mark(str(workdir), group)
    tempfile.tempdir = None
    _redirect_output(str(workdir / log_path(group, rank)))

    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import FileStore

    torch.set_num_threads(1)
    fn = resolve(task)
    # Absolute: a user's loop may change the working directory (os.chdir) under the task.
    report = reporter(str(workdir / result_path(group, rank)))
    # A FileStore needs no port: only Gloo's own sockets listen, on loopback.
    store = FileStore(str(workdir / "pg" / group), world_size)
    dist.init_process_group(
        "gloo",
        store=store,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout),
        pg_options=loopback_gloo_options(),
    )
    fixture.take_interrupts()
    try:
        fn(rank, world_size, payload, report)
        (workdir / finished_path(group, rank)).touch()
    except AppRaised as exc:
        _print_traceback(exc.error)
        durable.replace_file(
            workdir / raised_path(group, rank), canonical.dumps(raised_record(rank, exc))
        )
        sys.exit(1)
    except Exception as exc:
        # The user wants their fixture's frames, not this tool's: print those, exit 1.
        _print_traceback(exc)
        sys.exit(1)
    finally:
        dist.destroy_process_group()
        left = reaper.reap_children(
            exclude={c.pid for c in multiprocessing.active_children() if c.pid is not None}
        )
        if left:
            (workdir / stragglers_path(group, rank)).write_text("\n".join(left) + "\n")


def adopt_multiprocessing_temp_dir() -> None:
    """Put multiprocessing's sockets where the runner's are, in a worker that is a fresh
    interpreter (torchrun starts its ranks so).

    multiprocessing makes its sockets (a DataLoader worker's tensors go through one:
    ``DupFd`` in torch/multiprocessing/reductions.py, ``resource_sharer`` in
    multiprocessing/resource_sharer.py) in ``util.get_temp_dir()``, a ``pymp-*`` directory
    under TMPDIR chosen once per process (multiprocessing/util.py). A worker's TMPDIR is its
    scenario's, deeper than the runner's, and an AF_UNIX path over 108 bytes (104 on macOS)
    cannot be bound: the DataLoader's feeder thread then drops every batch and the rank waits
    for it until the timeout. Forked workers inherit the runner's directory, which is short
    (:func:`dcp_invariant.suite.workspace._short_socket_directory`); spawned standbys and
    torchrun's ranks are given it here. It is the runner's own, removed when the run ends.
    """
    directory = os.environ.get(MULTIPROCESSING_TEMP_ENV)
    config = multiprocessing.process.current_process()._config  # type: ignore[attr-defined]
    if directory and os.path.isdir(directory) and not config.get("tempdir"):
        config["tempdir"] = directory


def use_platform_start_method() -> None:
    """Give the loop the start method a script of its own gets: the platform's default.

    multiprocessing makes a child's default start method the one it was started with
    (``context._force_start_method`` in ``BaseProcess._bootstrap``, multiprocessing/process.py),
    so a worker from the fork server defaulted to ``forkserver`` (one from a standby, to
    ``spawn``). A loader with no ``multiprocessing_context`` uses that default
    (torch/utils/data/dataloader.py, ``_MultiProcessingDataLoaderIter``; torchdata's
    ``StatefulDataLoader`` likewise): each worker then started a fork server of its own, a fresh
    interpreter that preloads none of torch, and every DataLoader worker forked from it imported
    torch anew, seconds for each ``iter(loader)``; the server was left running and reported as
    a straggler. Reset, the default is what ``python train.py`` has: ``fork`` on Linux before
    Python 3.14, ``spawn`` on macOS and Windows.
    """
    multiprocessing.set_start_method(None, force=True)


def standby(
    jobs: Any, ready: Any, parent: int, home: str, preload: list[str], multiprocessing_temp: str
) -> None:
    """A spawned interpreter that imports what workers need, then waits for its one job.

    Spawning costs a whole interpreter start and ``import torch``; done ahead, while other
    scenarios run, a spawned worker is handed out as fast as a forked one and is as fresh:
    nothing ran in it but imports. It takes one job and exits; it is never reused.
    """
    die_with_parent(parent)
    leave_terminal_session()
    status = _SkipTeardown()
    os.environ.update(isolated_environment(Path(home)))
    os.environ[MULTIPROCESSING_TEMP_ENV] = multiprocessing_temp  # adopted by run()
    tempfile.tempdir = None
    import_frozen(preload)
    with contextlib.suppress(OSError):  # BrokenPipeError: the pool has stopped listening
        ready.send(imported_versions())
    ready.close()
    try:
        job = jobs.recv()
    except EOFError:
        status.code = 0
        return  # the pool closed without a job for this one
    jobs.close()
    try:
        start_in_workspace(job)
    except SystemExit as exc:
        status.code = exit_status(exc.code)
        raise
    status.code = 0


class _SkipTeardown:
    """End a spawned worker as a forked one ends: ``os._exit`` once its process has finished.

    A forked worker leaves through ``os._exit`` (multiprocessing/popen_fork.py); a spawned one
    through ``sys.exit`` (multiprocessing/spawn.py ``spawn_main``), and finalizing an
    interpreter that imported torch, DCP and torch._dynamo costs about 1.8 s of CPU here, a
    third of the worker's start-up. atexit runs handlers last in, first out, so this one,
    registered before the imports, runs after those torch's modules and the job registered,
    and after ``Process._bootstrap`` has reaped the job's children, shut down its threads and
    flushed stdout and stderr. ``code`` stays 1 (what ``_bootstrap`` reports for an uncaught
    exception) unless set. As with a forked worker, what ``_bootstrap`` does after the job
    cannot change the status (the job's results are written by then), and C-level stdio
    buffers are not flushed: the job's output goes through Python's streams.
    """

    def __init__(self) -> None:
        self.code = 1
        atexit.register(self._exit)

    def _exit(self) -> None:
        exit_without_teardown(self.code)


def imported_versions() -> dict[str, str | None]:
    """torch's and NumPy's versions as this interpreter imported them; None: not imported."""
    modules = {name: sys.modules.get(name) for name in ("numpy", "torch")}
    return {name: None if m is None else str(m.__version__) for name, m in modules.items()}


def import_frozen(modules: list[str]) -> None:
    """Import ``modules`` (skipping any this torch release lacks, as the fork server does),
    under :func:`imports_frozen`."""
    with imports_frozen():
        for module in modules:
            try:
                importlib.import_module(module)
            except ImportError:
                continue


@contextlib.contextmanager
def imports_frozen() -> Iterator[None]:
    """Imports build millions of long-lived objects and no garbage; the collector would walk them
    over and over (0.5-0.9 s of 3 s here). It is off while they run, and what they built is
    then frozen, as CPython's gc documentation advises a pre-forking server, so the job's own
    collections do not walk it again either.
    """
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def exit_without_teardown(code: int) -> NoReturn:
    """Flush and leave now, as a forked worker does, skipping interpreter finalization."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_status(code: object) -> int:
    """The status ``multiprocessing``'s ``Process._bootstrap`` gives a ``SystemExit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


@dataclass(frozen=True)
class Job:
    """One rank's job: a forked worker's argument, or what a standby reads from its pipe."""

    task: str  # "module:function", imported here (payloads.Task)
    rank: int
    world_size: int
    workdir: str
    group: str
    payload: Mapping[str, Any]
    timeout: float


def start_in_workspace(job: Job) -> None:
    """Target of a forked or spawned worker: move into the workspace, then :func:`run`."""
    try:
        os.chdir(job.workdir)
    except OSError:
        # The run was interrupted between handing out this job and its start, and its
        # workspace is gone: there is nothing to do and no one to tell.
        exit_without_teardown(WORKSPACE_GONE_EXIT_CODE)
    run(job.task, job.rank, job.world_size, job.group, dict(job.payload), job.timeout)


# A worker whose workspace vanished before it started: the run is being torn down.
WORKSPACE_GONE_EXIT_CODE = 75


def leave_terminal_session() -> None:
    """Lead a session of its own: a Ctrl-C at the terminal reaches the runner only (which stops
    everything), not each worker with a KeyboardInterrupt; and what this worker starts stays in
    its session, where the pool finds it when the group ends. A process that already leads one
    (torchrun's ranks) keeps it.

    The runner starts processes with SIGINT blocked (:func:`interrupts_held`), so a Ctrl-C that
    came during this interpreter's start-up is pending: it is discarded here (setting SIG_IGN
    discards a pending signal, POSIX sigaction), and SIGINT unblocked.
    """
    if hasattr(os, "setsid"):
        with contextlib.suppress(PermissionError):
            os.setsid()
    if sys.platform != "win32" and signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []):
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Start processes inside this block with SIGINT blocked (a signal mask survives fork and
    exec): a Ctrl-C at the terminal reaches the whole foreground process group, and a child
    still starting up, importing torch before it could leave that group, would print a
    KeyboardInterrupt traceback to the user's terminal. Only this thread's mask changes; the
    runner's main thread still takes the Ctrl-C."""
    if sys.platform == "win32":  # no pthread_sigmask
        yield
        return
    from multiprocessing import resource_tracker

    saved = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        # Starting multiprocessing's resource tracker unblocks SIGINT on the way out, whatever
        # the mask was (``ensure_running`` in multiprocessing/resource_tracker.py), and the fork
        # server's start and each spawn start it first: it is started here, then SIGINT is
        # blocked again, so the process that follows starts with it blocked.
        resource_tracker.ensure_running()
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, saved)


def _print_traceback(exc: BaseException) -> None:
    frames = traceback.extract_tb(exc.__traceback__)
    package = str(Path(__file__).resolve().parent.parent)
    theirs = [f for f in frames if not str(Path(f.filename).resolve()).startswith(package)]
    if theirs:
        print("Traceback (most recent call last; dcp-invariant's own frames left out):")
        print("".join(traceback.format_list(theirs)), end="")
        print("".join(traceback.format_exception_only(exc)), end="", flush=True)
    else:
        traceback.print_exception(exc, file=sys.stdout)
    sys.stdout.flush()


def reporter(path: str) -> Reporter:
    def report(record: dict[str, Any]) -> None:
        durable.replace_file(Path(path), canonical.dumps(record))

    return report


def resolve(task: str) -> Task:
    module_name, _, attr = task.partition(":")
    fn: Task = getattr(importlib.import_module(module_name), attr)
    return fn


def _redirect_output(path: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
