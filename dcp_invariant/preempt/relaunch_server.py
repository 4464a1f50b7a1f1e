"""Launches of a ``python script.py ...`` job that do not pay for a fresh interpreter
importing torch: a server that imported torch once forks each launch after the first (the
instrumented ones, with the interposer it preloaded, and the relaunches), which runs the
script as ``python script.py`` would (``runpy.run_path`` under ``__main__``, ``sys.argv`` and
``sys.path[0]`` as the interpreter sets them, the working directory and environment of the
launch, its own session, its output to the launch's file).

Not faithful where the job depends on what importing torch read before the fork: variables
torch reads at import (``OMP_NUM_THREADS`` and the like) are the launch's own, as the server
starts with the launch's environment; modules the server imported are not imported again;
and at its end the modules are not torn down (:func:`_exit`). docs/preempt.md says so. The
first launch, which every other is judged against, is always a fresh interpreter, and the
second, forked, must agree with it.

Protocol, per relaunch, on a Unix socket: the tool sends one JSON line ``{"argv", "cwd",
"env", "output"}``; the server forks a keeper, which forks the job, writes the job's PID, waits
for it and writes its exit status (a negative signal number for a kill), and exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

if sys.platform == "win32":  # fork and Unix sockets; preempt refuses other systems first
    raise ImportError("preempt's relaunch server runs on Linux")

from dcp_invariant.preempt.sockets import SOCKET_ENV  # after the refusal above

SERVER_CODE = """
import sys
base = [p for p in sys.path if p != ""]
sys.path.insert(0, {package_root!r})
from dcp_invariant.preempt.relaunch_server import serve
serve({socket_path!r}, base, {tool})
"""


def serve(socket_path: str, base_path: list[str], tool: int) -> None:
    """The server's main: import torch, then fork a keeper per request until the tool hangs up."""
    _die_with(tool)
    import signal

    _preload()

    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # keepers are reaped by the kernel
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path)
    listener.listen(16)
    print("ready", flush=True)
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            request = json.loads(conn.makefile("rb").readline())
            if request.get("stop"):
                return
            server = os.getpid()
            if os.fork() == 0:
                listener.close()
                request["base_path"] = base_path
                request["server"] = server
                _keep(conn, request)  # never returns


def _preload() -> None:
    """Import what every relaunch would import again: torch, and what torch imports on its
    first use (:mod:`dcp_invariant.torch_first_use`: constructing an optimizer imports
    torch._dynamo, about 1 s of a small job's relaunch). The collector is off meanwhile and
    what was built is frozen, as CPython's gc documentation advises a pre-forking server. A job
    without torch still saves the start."""
    import gc
    import importlib

    from dcp_invariant import torch_first_use

    gc.disable()
    try:
        for module in ("torch", *torch_first_use.MODULES):
            with contextlib.suppress(ImportError):  # absent from this torch release, or no torch
                importlib.import_module(module)
    finally:
        gc.freeze()
        gc.enable()


def _keep(conn: socket.socket, request: dict[str, Any]) -> None:
    """The keeper: fork the job, say its PID, wait for it, say how it ended, exit."""
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _die_with(request["server"])
    keeper = os.getpid()
    pid = os.fork()
    if pid == 0:
        conn.close()
        _die_with(keeper)  # a job in a session of its own is not in the server's group
        _run_job(request)  # never returns
    conn.sendall(f"{pid}\n".encode())
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    try:
        conn.sendall(f"{code}\n".encode())
    finally:
        os._exit(0)


def _run_job(request: dict[str, Any]) -> None:
    """The job, as ``python script.py args`` would run it in the launch's directory."""
    import runpy
    import signal
    import traceback

    os.setsid()  # its own session and group, as a fresh launch's: killed whole
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    fd = os.open(request["output"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if SOCKET_ENV in os.environ:
        _report_operations()
    script = request["argv"][0]
    sys.argv = list(request["argv"])
    # As `python script.py` sets it: the script's directory, then the interpreter's own path
    # (the server's, without the "" that -c put first and the package it was started with).
    sys.path[:] = [os.path.dirname(os.path.abspath(script)), *request["base_path"]]
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:  # the job's own failure, shown as the interpreter shows it
        traceback.print_exc()
        code = 1
    _exit(code)


def _exit(code: int) -> None:
    """End the job as the interpreter's own exit does what a job can see (Py_FinalizeEx in
    CPython's Python/pylifecycle.c): wait for its non-daemon threads, run its atexit handlers,
    flush what it wrote to files it never closed; then leave. What is skipped is the teardown
    of every module torch brought (about 0.5 s a relaunch, the most of a small job's), where
    only a ``__del__`` with an effect outside the process could differ: docs/preempt.md says
    so."""
    import atexit
    import gc
    import io
    import threading

    shutdown: Callable[[], None] = getattr(threading, "_shutdown")  # noqa: B009  # private
    shutdown()  # what the interpreter's exit calls first
    atexit._run_exitfuncs()
    # Exact types: isinstance against io's ABCs would run every class's __instancecheck__
    # (torch's deprecated aliases warn from theirs).
    buffered = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom)
    for stream in gc.get_objects():
        if type(stream) in buffered and not stream.closed:
            with contextlib.suppress(OSError, ValueError):  # as a failed flush at exit is lost
                stream.flush()
    os._exit(code & 0xFF)


def _report_operations() -> None:
    """An instrumented launch, forked: the server was started with the interposer preloaded and
    inactive (no socket named), and this job's environment names its socket, so the interposer
    starts reporting now, as it does at load in a fresh launch."""
    import ctypes

    # A preloaded library's symbols are in the process's global namespace.
    if not ctypes.CDLL(None).dcp_invariant_preempt_activate():
        raise RuntimeError("the interposer is not preloaded, or its directory is gone")


def _die_with(parent: int) -> None:
    """Have the kernel kill this process when ``parent`` dies (``PR_SET_PDEATHSIG``, Linux): the
    tool, the server or a keeper killed leaves no job running. A parent gone before the call
    has handed this process on already: it exits at once."""
    import ctypes
    import signal

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _exit_code(code: object) -> int:
    """What the interpreter exits with for ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


class Client:
    """The tool's end: the server started with ``python`` and ``env``, and one relaunch at a
    time per call to :meth:`run` (several threads may call it at once)."""

    def __init__(self, python: str, env: dict[str, str], directory: str, timeout: float) -> None:
        import subprocess
        from pathlib import Path

        import dcp_invariant
        from dcp_invariant.preempt.sockets import socket_directory

        self._sockets = socket_directory(directory)
        self.socket_path = os.path.join(self._sockets, "relaunch")
        root = str(Path(dcp_invariant.__file__).resolve().parent.parent)
        code = SERVER_CODE.format(package_root=root, socket_path=self.socket_path, tool=os.getpid())
        self.process = subprocess.Popen(
            [python, "-c", code],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self._timeout = timeout

    def ready(self) -> None:
        """Wait until the server has imported what it preloads (RuntimeError: it failed). Its
        imports take about as long as a launch of the job, so the tool starts it first and
        waits here once it needs it. Started from the thread that waits: the kernel kills the
        server when that thread ends (``PR_SET_PDEATHSIG`` follows the thread)."""
        assert self.process.stdout is not None
        try:
            ready = _read_line(self.process.stdout.fileno(), self._timeout)
        except BaseException:  # an interrupt while it starts: it must not outlive the tool
            self.close()
            raise
        if ready != "ready":
            self.close()
            raise RuntimeError("the relaunch server did not start")

    def start(
        self, argv: list[str], cwd: str, env: dict[str, str], output: str
    ) -> tuple[int, socket.socket]:
        """Start the job: its PID (to kill it), and the connection :meth:`wait` reads."""
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.socket_path)
        request = {"argv": argv, "cwd": cwd, "env": env, "output": output}
        conn.sendall(json.dumps(request).encode() + b"\n")
        try:
            return int(_read_line(conn.fileno(), 60.0)), conn
        except BaseException:
            conn.close()
            raise

    @staticmethod
    def wait(conn: socket.socket, timeout: float) -> int | None:
        """The job's exit status (a negative signal number for a kill); None past ``timeout``."""
        with conn:
            try:
                return int(_read_line(conn.fileno(), timeout))
            except (TimeoutError, ValueError):  # ValueError: the keeper died without a word
                return None

    def close(self) -> None:
        import contextlib
        import shutil
        import signal

        with contextlib.suppress(ProcessLookupError):  # it ended already
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        shutil.rmtree(self._sockets, ignore_errors=True)


def _read_line(fd: int, timeout: float) -> str:
    """One line from ``fd`` within ``timeout`` seconds: TimeoutError after that."""
    import select
    import time

    deadline = time.monotonic() + timeout
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError("no answer in time")
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        data += chunk
    return data.decode().strip()
