"""One launch of the user's command: ``{run_dir}`` filled in, its output kept in files, bounded
by a timeout, and every process it started killed when it ends or the run is interrupted.

Its output goes to files, not pipes, so the recorder can read everything the job printed up to
the instant it reports an operation (:mod:`.recorder`): the job writes its step lines before
the save that follows them, and ``PYTHONUNBUFFERED`` makes Python's streams write them at once.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dcp_invariant.preempt import relaunch_server

RUN_DIR = "{run_dir}"
# A traceback's last line: an exception's dotted name, then its message.
_ERROR = re.compile(
    r"^(\[(default)?rank\d+\]:\s*)?([A-Za-z_][\w]*\.)*[A-Za-z_]\w*(Error|Exception)(: |$)"
)
# What a relaunch's failure shows of its output.
TAIL_LINES = 12


@dataclass(frozen=True)
class Launch:
    """How a launch ended (``exit_code`` None: killed at its timeout) and what it printed."""

    exit_code: int | None
    lines: list[str]

    @property
    def tail(self) -> list[str]:
        return self.lines[-TAIL_LINES:]

    @property
    def first_error(self) -> str | None:
        """The first line that names an exception (``ValueError: ...``, torchrun's rank output
        prefixed ``[rank1]:``): the cause, where a launcher's own summary ends the output."""
        return next((line for line in self.lines if _ERROR.match(line)), None)


def filled(command: Sequence[str], run_dir: Path) -> list[str]:
    """``command`` with every ``{run_dir}`` replaced, as a substring too (``--out={run_dir}``)."""
    return [arg.replace(RUN_DIR, str(run_dir)) for arg in command]


class Launches:
    """The launches under way; :meth:`stop_all` kills them all (an interrupt)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: set[int] = set()
        self.stopping = False
        # When each launch ran (time.monotonic): the benchmark's measure of the tool's own
        # overhead, the time no launch was running. Never in the evidence.
        self.spans: list[tuple[float, float]] = []

    @contextlib.contextmanager
    def _timed(self) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        finally:
            with self._lock:
                self.spans.append((start, time.monotonic()))

    def run(
        self,
        command: Sequence[str],
        run_dir: Path,
        output: Path,
        timeout: float,
        env: Mapping[str, str] | None = None,
        started: Callable[[int], None] | None = None,
    ) -> Launch:
        """Run ``command`` on ``run_dir`` from the caller's working directory; its stdout and
        stderr go to ``output`` (one file: the step lines of both are read in order)."""
        environment = _environment(env)
        with output.open("wb") as sink, self._lock:
            if self.stopping:
                raise InterruptedError("the run is being interrupted")
            proc = subprocess.Popen(
                filled(command, run_dir),
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,  # its group is killed whole: torchrun's ranks too
            )
            self._live.add(proc.pid)
        if started is not None:
            started(proc.pid)
        try:
            with self._timed():
                code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            kill_tree(proc.pid)
            proc.wait()
            with self._lock:
                self._live.discard(proc.pid)
        return _ended(code, output)

    def forked(
        self,
        server: relaunch_server.Client,
        command: Sequence[str],
        run_dir: Path,
        output: Path,
        timeout: float,
        env: Mapping[str, str] | None = None,
        started: Callable[[int], None] | None = None,
    ) -> Launch:
        """As :meth:`run`, the job forked by the relaunch server (``python script.py ...``)."""
        argv = filled(command, run_dir)[1:]
        environment = _environment(env)
        output.touch()
        with self._lock:
            if self.stopping:
                raise InterruptedError("the run is being interrupted")
        with self._timed():
            pid, conn = server.start(argv, os.getcwd(), environment, str(output))
            with self._lock:
                self._live.add(pid)  # stop_all kills it: its keeper then answers at once
            if started is not None:
                started(pid)
            code = self._waited(server, conn, pid, timeout)
        return _ended(code, output)

    def _waited(
        self, server: relaunch_server.Client, conn: socket.socket, pid: int, timeout: float
    ) -> int | None:
        try:
            code = server.wait(conn, timeout)
            if code is None:
                kill_tree(pid)
        finally:
            with self._lock:
                self._live.discard(pid)
        return code

    def stop_all(self) -> None:
        with self._lock:
            self.stopping = True
            live = list(self._live)
        for pid in live:
            kill_tree(pid)


def _environment(env: Mapping[str, str] | None) -> dict[str, str]:
    """The caller's environment, ``env`` over it, and Python's streams unbuffered."""
    return {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}


def _ended(code: int | None, output: Path) -> Launch:
    return Launch(code, output.read_text(encoding="utf-8", errors="replace").splitlines())


def kill_tree(leader: int) -> None:
    """Kill the launch's process group and every process descended from its leader (a
    launcher's ranks may start sessions of their own)."""
    if sys.platform == "win32":  # refused before any launch: interposer.library()
        raise NotImplementedError("preempt runs on Linux")
    for pid in [leader, *descendants(leader)]:
        with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):  # the group is empty
        os.killpg(leader, signal.SIGKILL)


def descendants(leader: int) -> list[int]:
    """The processes descended from ``leader``, read from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it ended meanwhile
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [leader]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stopped(pids: Sequence[int], within: float = 2.0) -> None:
    """Wait until each of ``pids`` is stopped (or gone), up to ``within`` seconds."""
    deadline = time.monotonic() + within
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                break  # gone
            if stat[stat.rindex(")") + 2] in "TtZX":
                break
            time.sleep(0.001)
