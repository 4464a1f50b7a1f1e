"""The fork server's first import: the server dies with the runner, leaves the terminal's
session, and keeps the runner's PID from the workers it forks. Each test starts a stand-in
server (a fresh interpreter that imports the module first, as multiprocessing's server does)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest
from proc_state import alive, stat, wait_until

from dcp_invariant.suite import worker

# The pool starts a fork server on Linux only (pool.start_method); elsewhere it spawns.
if sys.platform != "linux":
    pytest.skip("the fork server is Linux's", allow_module_level=True)

TIMEOUT = 60

# The server: imports the module first, says what it became, then waits as a server would.
REPORT = (
    "import os, time; import dcp_invariant.suite.fork_server; "
    "from dcp_invariant.suite import worker; "
    "print(os.getpid(), os.getsid(0), worker.PARENT_PID_ENV in os.environ, flush=True)"
)
SERVER = REPORT + "; time.sleep(60)"

# The runner: starts the server with its own PID in the environment, as the pool does
# (WorkerPool.start), passes on what the server printed, then waits to be killed.
RUNNER = f"""
import os, subprocess, sys
from dcp_invariant.suite import worker

env = {{**os.environ, worker.PARENT_PID_ENV: str(os.getpid())}}
server = subprocess.Popen([sys.executable, "-c", {SERVER!r}], env=env, stdin=subprocess.DEVNULL)
sys.stdin.read()
"""


def test_the_server_dies_with_its_runner_in_a_session_of_its_own_without_the_runners_pid() -> None:
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert runner.stdout is not None
    server = None
    try:
        line = runner.stdout.readline().split()
        assert len(line) == 3, line
        server, session, has_parent_pid = int(line[0]), int(line[1]), line[2] == "True"
        assert session == server, "the server stayed in the runner's session"
        assert session != os.getsid(0)
        # Its workers' parent is the server, not the runner: they must not compare against it.
        assert not has_parent_pid
        fields = stat(server)
        assert fields is not None and int(fields[1]) == runner.pid

        runner.kill()  # SIGKILL: the runner runs no cleanup
        runner.wait(timeout=TIMEOUT)
        assert wait_until(lambda: not alive(server), 5.0), "the server outlived its runner"
    finally:
        if runner.poll() is None:
            runner.kill()
        if server is not None and alive(server):
            os.kill(server, signal.SIGKILL)  # first: it holds the runner's output open
        runner.communicate(timeout=TIMEOUT)
        if server is not None:
            # Ours to reap only if this process is a subreaper (PR_SET_CHILD_SUBREAPER).
            with contextlib.suppress(ChildProcessError):
                os.waitpid(server, os.WNOHANG)


def test_a_server_whose_runner_is_already_gone_leaves_before_anything_else() -> None:
    """The runner's PID comes from the environment the server started with: a server whose
    parent is not that runner (it died, and the server was handed on) exits at once."""
    done = subprocess.run(
        [sys.executable, "-c", REPORT],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        env={**os.environ, worker.PARENT_PID_ENV: "1"},
        check=False,
    )
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
