"""The tool's end of the interposer: it hears every file operation of an instrumented launch
as it is about to happen, numbers it, and at a chosen crash point takes the run directory as
the job left it, with every process of the job stopped.

Each operation waits for the tool's answer, so the state taken is exactly "every earlier
operation done, this one not" for the process that reports it; the job's other processes are
stopped (SIGSTOP takes effect between system calls) while the copy is made, so what is copied
is one instant's state, never a mixture.

At a SIGTERM point it instead sends SIGTERM to the launch's leader just before the operation
goes on, as a scheduler signals a job's first process (Kubernetes: the container's PID 1;
torchrun passes it on to its ranks), and SIGKILLs every process of the launch once the grace
period is over; when the leader exits first, the launch's end kills the rest, as a container's
end does.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dcp_invariant.evidence.preempt.operations import Identity, Numbering, Occurrences, Operation
from dcp_invariant.evidence.preempt.step_lines import steps
from dcp_invariant.preempt import launch
from dcp_invariant.preempt.sockets import ROOT_ENV, SOCKET_ENV, socket_directory


class Recorder:
    """Serves one instrumented launch: its operations in order, and the crash states taken
    at ``chosen`` (each an :data:`.operations.Identity`) into ``snapshots``; or, with
    ``terminate``, SIGTERM before that operation and SIGKILL ``grace`` seconds later."""

    def __init__(
        self,
        directory: Path,
        run_dir: Path,
        output: Path,
        regex: re.Pattern[str],
        chosen: set[Identity] | None = None,
        snapshots: Path | None = None,
        terminate: Identity | None = None,
        grace: float = 0.0,
    ) -> None:
        self.operations: list[Operation] = []
        self.taken: dict[Identity, Path] = {}
        self._sockets = Path(socket_directory(str(directory)))  # removed with the server
        self._path = self._sockets / "ops"
        self.run_dir, self.output, self._regex = run_dir, output, regex
        self._chosen, self._snapshots = chosen or set(), snapshots
        self._numbering = Numbering()
        self._occurrences = Occurrences()
        self._lock = threading.Lock()
        self._seen = 0  # bytes of the output already read
        self._partial = ""
        self._last_step = 0
        self.leader: int | None = None
        self._terminate, self._grace = terminate, grace
        self.terminated = False  # the SIGTERM was sent
        self.outlived_grace = False
        self._killer: threading.Timer | None = None
        if sys.platform == "win32":  # refused before any launch: interposer.library()
            raise NotImplementedError("preempt runs on Linux")
        self._server: socket.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self._path))
        self._server.listen(64)

    def environment(self, library: Path) -> dict[str, str]:
        preload = os.environ.get("LD_PRELOAD", "")
        return {
            "LD_PRELOAD": f"{library} {preload}".strip(),
            SOCKET_ENV: str(self._path),
            ROOT_ENV: str(self.run_dir),
        }

    @contextmanager
    def serving(self) -> Iterator[None]:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        try:
            yield
        finally:
            if self._killer is not None:
                self._killer.cancel()
            self._server.close()
            shutil.rmtree(self._sockets, ignore_errors=True)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed: the launch is over
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as lines:
            try:
                for raw in lines:
                    self._heard(raw.decode("utf-8", errors="replace"))
                    conn.sendall(b"k")
            except (ConnectionResetError, BrokenPipeError):
                return  # the process was killed: a crash point's SIGTERM or SIGKILL

    def _heard(self, line: str) -> None:
        with self._lock:
            operation = self._numbering.parse(line, self._steps_printed())
            if operation is None:
                return
            self.operations.append(operation)
            identity = self._occurrences.of(operation)
            if identity in self._chosen and self._snapshots is not None:
                self._take(identity)
            if identity == self._terminate and not self.terminated:
                self._signal_leader()

    def _signal_leader(self) -> None:
        """SIGTERM now, before the operation is answered, so the job's handler runs as soon as
        the operation returns; SIGKILL for every process once the grace period is over."""
        assert self.leader is not None
        if sys.platform == "win32":  # refused before any launch: interposer.library()
            raise NotImplementedError("preempt runs on Linux")
        self.terminated = True
        _signal(self.leader, signal.SIGTERM)
        self._killer = threading.Timer(self._grace, self._kill, (self.leader,))
        self._killer.daemon = True
        self._killer.start()

    def _kill(self, leader: int) -> None:
        self.outlived_grace = True  # where it was killed then is an instant's chance
        launch.kill_tree(leader)

    def _steps_printed(self) -> int:
        """The last step the job has printed, read from its output as it stands now."""
        with self.output.open("rb") as file:
            file.seek(self._seen)
            new = file.read()
        self._seen += len(new)
        text = self._partial + new.decode("utf-8", errors="replace")
        *complete, self._partial = text.split("\n")
        found = steps(complete, self._regex)
        if found:
            self._last_step = max(self._last_step, max(found))
        return self._last_step

    def _take(self, identity: Identity) -> None:
        assert self._snapshots is not None and self.leader is not None
        if sys.platform == "win32":  # refused before any launch: interposer.library()
            raise NotImplementedError("preempt runs on Linux")
        pids = [self.leader, *launch.descendants(self.leader)]
        for pid in pids:
            _signal(pid, signal.SIGSTOP)
        try:
            launch.stopped(pids)
            target = self._snapshots / f"{len(self.taken):05d}"
            shutil.copytree(self.run_dir, target, symlinks=True)
            self.taken[identity] = target
        finally:
            for pid in pids:
                _signal(pid, signal.SIGCONT)


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
        os.kill(pid, sig)
