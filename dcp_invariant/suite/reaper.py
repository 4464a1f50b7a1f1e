"""Every process a run starts ends with it: workers, what torch starts for them, what a loop leaves.

The pool kills the processes it started, but not what those start in turn: ``async_save``'s
process mode spawns a checkpoint process per rank (``mp.get_context("spawn")`` in
``torch/distributed/checkpoint/_async_process_executor.py``), torch's elastic agent starts its
ranks in sessions of their own (``start_new_session=True`` in
``torch/distributed/elastic/multiprocessing/subprocess_handler/subprocess_handler.py``), and a
user's loop may start anything. ``PR_SET_PDEATHSIG`` reaches none of them: it is set per process
and cleared across ``fork``.

Two marks find them on Linux, whatever session they moved to:

- the run's token, in the environment of every process the run starts (an environment is
  inherited across ``fork`` and ``exec`` alike, and ``/proc/<pid>/environ`` shows the one a
  process was started with);
- a group's token, which each worker puts in its own environment, and the session each worker
  leads, which catches a child forked without ``exec``.

A guardian process, started first and in a session of its own, holds a pipe from the runner;
when the pipe ends (the runner finished, or was killed with SIGKILL and ran no cleanup at all),
it kills every process that carries the run's token. Elsewhere there is no ``/proc``: there the
pool kills its workers and ``taskkill /T`` the torchrun tree, and what they started may outlive
a killed worker (docs/limits.md says so).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

RUN_ENV = "DCP_INVARIANT_RUN"
GROUP_ENV = "DCP_INVARIANT_GROUP"
PROC = Path("/proc")
# How long a sweep keeps killing: a process may fork while it is being killed.
SWEEP_SECONDS = 2.0
# multiprocessing starts its resource tracker by itself, and it leaves when its last client does
# (multiprocessing/resource_tracker.py): killed with the rest, never named as a loop's child.
_OWN_HELPERS = (b"multiprocessing.resource_tracker",)


@dataclass(frozen=True)
class Straggler:
    """A process found still running; ``name`` is its program, without PID, path or arguments."""

    pid: int
    name: str
    helper: bool  # multiprocessing's own resource tracker


def supported() -> bool:
    return sys.platform == "linux" and PROC.is_dir()


def new_token() -> str:
    return secrets.token_hex(16)


def group_mark(workdir: str, group: str) -> str:
    """A worker group's token: its workspace and name, unique within a run."""
    return f"{workdir}::{group}"


def _environ_has(pid: int, variable: str, value: str) -> bool:
    try:
        environ = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    return os.fsencode(f"{variable}={value}") in environ.split(b"\0")


def _stat(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat`` after the command name: state, ppid, pgrp, session, ...; None: gone.

    The name stands in parentheses and may itself hold spaces and parentheses: the fields
    start after the last ``)`` (proc(5)).
    """
    try:
        stat = (PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def _session(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[3]) if fields is not None and len(fields) > 3 else None


def _pids() -> list[int]:
    me = os.getpid()
    return [int(e.name) for e in PROC.iterdir() if e.name.isdigit() and int(e.name) != me]


def carrying(variable: str, value: str) -> list[int]:
    """Processes whose starting environment holds ``variable=value``."""
    if not supported():
        return []
    return [pid for pid in _pids() if _environ_has(pid, variable, value)]


def of_group(mark: str, sessions: set[int]) -> list[int]:
    """A finished group's processes: its token in their environment, or one of its sessions."""
    if not supported():
        return []
    return [
        pid for pid in _pids() if _session(pid) in sessions or _environ_has(pid, GROUP_ENV, mark)
    ]


def become_subreaper() -> None:
    """Orphaned descendants of this process are re-parented to it, not to init (Linux
    ``PR_SET_CHILD_SUBREAPER``): a double-forked daemon stays findable by its parent."""
    if not supported():
        return
    import ctypes

    pr_set_child_subreaper = 36
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0)


def _parent(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields is not None and len(fields) > 1 else None


def reap_children(exclude: set[int]) -> list[str]:
    """Kill and reap this process's children but ``exclude`` (those multiprocessing itself ends
    at exit, as torch's checkpoint process and DataLoader workers); their programs' names,
    sorted, multiprocessing's resource tracker left unnamed."""
    me = os.getpid()
    killed = kill_all(lambda: [p for p in _children_of(me) if p not in exclude])
    for straggler in killed:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(straggler.pid, 0)
    return sorted(s.name for s in killed if not s.helper)


def _children_of(parent: int) -> list[int]:
    if not supported():
        return []
    return [pid for pid in _pids() if _parent(pid) == parent]


def describe(pid: int) -> Straggler | None:
    try:
        command = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    program = command.split(b"\0", 1)[0]
    name = os.path.basename(os.fsdecode(program)) or "?"
    return Straggler(pid, name, any(h in command for h in _OWN_HELPERS))


def kill_all(find: Callable[[], list[int]], seconds: float = SWEEP_SECONDS) -> list[Straggler]:
    """SIGKILL what ``find`` returns until it returns nothing (or ``seconds`` pass).

    Returns each process killed, described before the kill. A zombie whose parent is gone is
    reaped by init; one whose parent is this process is reaped here.
    """
    if sys.platform == "win32":
        return []  # every finder here reads /proc, which Windows lacks (as it lacks SIGKILL)
    killed: dict[int, Straggler] = {}
    deadline = time.monotonic() + seconds
    while True:
        found = [pid for pid in find() if not _zombie(pid)]
        if not found or time.monotonic() > deadline:
            return list(killed.values())
        for pid in found:
            if pid not in killed:
                described = describe(pid)
                if described is not None:
                    killed[pid] = described
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _zombie(pid: int) -> bool:
    fields = _stat(pid)
    return fields is None or fields[:1] in ([b"Z"], [b"X"])  # gone, or only its status is left


class Guardian:
    """The run's token in this process's environment, and a process that kills its carriers.

    ``with Guardian():`` sets ``$DCP_INVARIANT_RUN`` for everything started inside; leaving it
    (or this process dying) ends the guardian's pipe, and the guardian kills every process still
    carrying the token. :meth:`sweep` does the same at once, from this process.
    """

    def __init__(self) -> None:
        self.token = new_token()
        self._proc: subprocess.Popen[bytes] | None = None
        self._saved: str | None = None

    def __enter__(self) -> Guardian:
        if supported():
            env = {k: v for k, v in os.environ.items() if k != RUN_ENV}
            self._proc = subprocess.Popen(
                [sys.executable, "-m", __name__, self.token],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                # Its own session: a Ctrl-C at the terminal must not end it before the run ends.
                start_new_session=True,
                close_fds=True,
            )
        self._saved = os.environ.get(RUN_ENV)
        os.environ[RUN_ENV] = self.token
        return self

    @property
    def pid(self) -> int | None:
        """The guardian process's PID; None where there is none (no /proc to read)."""
        return None if self._proc is None else self._proc.pid

    def remove_if_killed(self, path: Path) -> None:
        """Have the guardian remove ``path`` should this process die without ending the run
        (SIGKILL): the run's workspace, multiprocessing's ``pymp-*`` directory."""
        self._tell(_TREE, path)

    def release_if_killed(self, lock: Path) -> None:
        """Have the guardian clear the output directory's lock ``lock`` and the staging
        directory it records should this process die without ending the run, once no process
        holds the lock (``clear_if_dead`` in dcp_invariant/suite/output_dir.py)."""
        self._tell(_LOCK, lock)

    def _tell(self, kind: bytes, path: Path) -> None:
        if self._proc is not None and self._proc.stdin is not None:
            # Absolute: the guardian's working directory is this process's at its start only.
            message = kind + b" " + os.fsencode(os.path.abspath(path)) + b"\0"
            with contextlib.suppress(OSError):  # the guardian is gone: the sweep still runs
                self._proc.stdin.write(message)
                self._proc.stdin.flush()

    def sweep(self) -> list[Straggler]:
        return kill_all(lambda: carrying(RUN_ENV, self.token))

    def __exit__(self, *exc: object) -> None:
        if self._saved is None:
            os.environ.pop(RUN_ENV, None)
        else:
            os.environ[RUN_ENV] = self._saved
        if self._proc is None:
            return
        assert self._proc.stdin is not None
        with contextlib.suppress(OSError):
            self._proc.stdin.write(_DONE + b"\0")
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=SWEEP_SECONDS + 1)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=5)


# The guardian's messages: a kind and a path, each ended by a NUL, which no path holds (the
# kernel takes paths as C strings) while a newline may be in one.
_TREE = b"tree"
_LOCK = b"lock"
_DONE = b"done"


def _guard(token: str) -> None:
    """The guardian: wait for the runner's pipe to end, then kill what carries its token; if
    the runner died before saying it was done, remove what it could not."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    data = b""
    with contextlib.suppress(OSError):
        data = sys.stdin.buffer.read()
    # Killing first frees the output directory's lock, should a process have inherited it.
    kill_all(lambda: carrying(RUN_ENV, token))
    messages = data.split(b"\0")
    if _DONE in messages:
        return
    from dcp_invariant.suite.output_dir import clear_if_dead
    from dcp_invariant.suite.workspace import remove

    for message in messages:
        kind, _, raw = message.partition(b" ")
        path = Path(os.fsdecode(raw))
        if kind == _TREE:
            with contextlib.suppress(OSError):  # removed already; what is left, the next run takes
                remove(path)
        elif kind == _LOCK:
            clear_if_dead(path)  # left as it is if anyone holds it: a live run took it over


if __name__ == "__main__":
    _guard(sys.argv[1])
