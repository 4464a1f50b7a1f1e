"""torch's torchrun agent for the restart scenario, started ahead of need.

The agent is a fresh interpreter that imports torch (``torch.distributed.run``) before it
starts a rank: about as long as ``import torch``, on the restart scenario's path, which is the
longest through a run. So where a core is left idle by the pool's own start (the fork server's
import of torch, or the spawn path's standbys), the runner starts the agent as the run begins,
with the scenario's environment and directory; it installs the guard, imports torch's launcher
and then waits, running no rank and no code of the user's (its import path is this package's;
its ranks get the user's), until the scenario has committed its baseline and says go
(:mod:`.launch`). On one core it would slow the probes, which say bad input first: there the
scenario starts its agent itself, as it always did. An agent the run does not use is killed.
"""

from __future__ import annotations

import contextlib
import multiprocessing.util
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

import dcp_invariant
from dcp_invariant import plan
from dcp_invariant.suite import installation, reaper, worker
from dcp_invariant.suite.pool import WorkerPool, kill_process_tree, reap_group
from dcp_invariant.suite.torchrun import guard
from dcp_invariant.suite.torchrun.launch import (
    GO_LINE,
    GUARD_REFUSED_EXIT_CODE,
    RANKS_PATH_ENV,
    STANDBY_ENV,
)

ATTESTATION_FILE = "guard.json"
LOG_FILE = "logs/torchrun.log"
TORCHRUN_GROUP = "torchrun"
# torchrun answers SIGTERM by stopping its workers, which run in sessions of their own (torch
# 2.13 starts them with start_new_session): the agent is asked first, then killed.
STOP_GRACE_SECONDS = 15.0


class Agent:
    """A torchrun agent waiting in ``workdir`` for :meth:`run`; tracked by ``pool``, whose
    cancellation kills it."""

    def __init__(self, pool: WorkerPool, workdir: Path) -> None:
        self.workdir = workdir
        self._pool = pool
        self._ended = False
        worker.prepare_workdir(workdir)
        command = [
            sys.executable,
            "-m",
            "dcp_invariant.suite.torchrun.launch",
            *list(plan.TORCHRUN_ARGUMENTS),
        ]
        env = dict(os.environ)
        env.update(worker.isolated_environment(workdir))
        env[guard.ATTESTATION_ENV] = ATTESTATION_FILE
        env[worker.PARENT_PID_ENV] = str(os.getpid())
        env[STANDBY_ENV] = "1"
        if sys.platform != "win32":  # Windows' multiprocessing makes no AF_UNIX sockets
            env[worker.MULTIPROCESSING_TEMP_ENV] = multiprocessing.util.get_temp_dir()
        # torch's agent starts each rank in a session of its own; the token finds them, and
        # what they start, when the job ends (:mod:`dcp_invariant.suite.reaper`).
        env[reaper.GROUP_ENV] = reaper.group_mark(os.path.realpath(workdir), TORCHRUN_GROUP)
        # Workers are fresh interpreters working in the scenario's directory: give them this
        # very package and, as multiprocessing does for its spawned children, the runner's
        # import path, where the fixture was found.
        package_parent = str(Path(dcp_invariant.__file__).resolve().parent.parent)
        search = [package_parent, *installation.import_path()]
        # The agent itself needs only this package, so nothing on the user's path (a
        # sitecustomize.py beside the fixture) runs in it before go; its ranks get the rest.
        env[RANKS_PATH_ENV] = os.pathsep.join(dict.fromkeys(search))
        env["PYTHONPATH"] = os.pathsep.join(
            [package_parent, *filter(None, [os.environ.get("PYTHONPATH")])]
        )
        self._log: IO[bytes] = open(workdir / LOG_FILE, "wb")  # noqa: SIM115  # closed by run/close
        try:
            self._proc = subprocess.Popen(
                command,
                cwd=workdir,
                env=env,
                stdin=subprocess.PIPE,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                **_new_process_group(),
            )
        except BaseException:
            self._log.close()
            raise
        try:
            pool.track(self._proc)
        except BaseException:
            self._end()
            raise

    def usable(self) -> bool:
        """Whether :meth:`run` may use this agent: neither run nor closed, and waiting or
        refused by the guard (which :meth:`run` then reports); one that died otherwise while
        it waited (killed from outside, out of memory) is reaped, and another takes its place."""
        if self._ended:
            return False
        code = self._proc.poll()
        if code is None or code == GUARD_REFUSED_EXIT_CODE:
            return True
        self._end()
        return False

    def run(self, timeout: float) -> tuple[int, bool, list[str]]:
        """Let torch's launcher run; its exit code, whether it outran ``timeout`` seconds (from
        now), and what its ranks left running."""
        proc = self._proc
        assert proc.stdin is not None and not self._ended, "an agent runs once"
        # An agent that has ended already (the guard refused this torch) ends as it did.
        with contextlib.suppress(OSError):
            proc.stdin.write(GO_LINE)
            proc.stdin.close()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(proc)
            return proc.wait(), True, []  # what was left is the stopped job, not a straggler
        finally:
            # The agent has reaped its ranks once it exits: anything still carrying the job's
            # token was left behind by a rank. Killed here, with the agent's own process group.
            left = reap_group(self.workdir, TORCHRUN_GROUP, {proc.pid})
            self._end()
        return code, False, left

    def close(self) -> None:
        """Kill an agent the run did not run: it has started no rank, so there is nothing to
        stop gracefully, and a run that ends early (bad input) does not wait for its import.
        Once the agent has ended, nothing."""
        self._end()

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        try:
            kill_process_tree(self._proc)
            if self._proc.stdin is not None:
                with contextlib.suppress(OSError):
                    self._proc.stdin.close()
            # Reaped, not left a zombie; on Windows taskkill returns before the process has
            # gone, and its working directory (the scenario's) could not be removed yet.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=STOP_GRACE_SECONDS)
        finally:
            self._pool.untrack(self._proc)
            self._log.close()


def _new_process_group() -> dict[str, Any]:
    if sys.platform == "win32":
        return {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP}
    return {"start_new_session": True}


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Ask torchrun to stop its workers (SIGTERM; Windows has no such request), then kill."""
    if sys.platform != "win32":
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_GRACE_SECONDS)
    kill_process_tree(proc)
