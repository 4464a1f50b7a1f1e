"""elastic_restart_2_to_2: torchrun restarts a failed 2-rank job; it resumes the committed generation.

The launch goes through torch's own launcher (``torch.distributed.run``), guarded by
:mod:`dcp_invariant.suite.torchrun.launch`, in its own process group so a timeout reaps the agent and
every worker it started.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import dcp_invariant
from dcp_invariant import canonical, plan
from dcp_invariant.commit import ReceiptMismatch, StoreError
from dcp_invariant.suite import reaper, worker
from dcp_invariant.suite.pool import WorkerPool, kill_process_tree, reap_group
from dcp_invariant.suite.scenarios.common import STORE_ROOT, ScenarioContext
from dcp_invariant.suite.scenarios.host import PoolHost
from dcp_invariant.suite.scenarios.payloads import Elastic
from dcp_invariant.suite.torchrun import guard
from dcp_invariant.suite.torchrun.elastic_rank import MARKER_FILE, attempt_group

ATTESTATION_FILE = "guard.json"
LOG_FILE = "logs/torchrun.log"
TORCHRUN_GROUP = "torchrun"
RESUMED_GROUP = attempt_group(1)  # the ranks torchrun starts again after the planned exit
# torchrun answers SIGTERM by stopping its workers, which run in sessions of their own (torch
# 2.13 starts them with start_new_session): the agent is asked first, then killed.
STOP_GRACE_SECONDS = 15.0


def run(ctx: ScenarioContext) -> dict[str, Any]:
    sc = ctx.scenario
    obs = ctx.begin(
        fixture=ctx.fixture,
        steps_before_save=ctx.run_plan.steps_before,
        commit=None,
        launcher=None,
        failure_marker=None,
        target=None,
        after=None,
    )
    with ctx.recording(obs):
        if not ctx.commit_baseline(obs):
            return obs

        # torchrun is started from this machine: the family runs on the worker pool only.
        assert isinstance(ctx.host, PoolHost), "elastic runs on this machine's worker pool"
        exit_code, timed_out, left = _torchrun(ctx, ctx.host.pool)
        # Each resumed rank (worker.run) kills and names its own children; the job's token
        # finds what escaped them.
        left += worker.stragglers(ctx.workdir, RESUMED_GROUP, sc.target_world_size)
        ctx.left_running(TORCHRUN_GROUP, left)
        attestation = ctx.workdir / ATTESTATION_FILE
        obs["launcher"] = {
            "arguments": list(plan.TORCHRUN_ARGUMENTS),
            "exit_code": exit_code,
            "timed_out": timed_out,
            "guard": canonical.loads(attestation.read_bytes(), what=ATTESTATION_FILE)
            if attestation.exists()
            else None,
        }
        if exit_code != 0:
            ctx.notes.append((ctx.workdir / LOG_FILE).read_text(errors="replace")[-4000:])
        marker = ctx.workdir / MARKER_FILE
        if marker.exists():
            obs["failure_marker"] = canonical.loads(marker.read_bytes(), what=MARKER_FILE)
        ranks = []
        for rank in range(sc.target_world_size):
            path = ctx.workdir / worker.result_path(RESUMED_GROUP, rank)
            if path.exists():
                record = canonical.loads(path.read_bytes(), what=path.name)
                ranks.append({**record, "generation": ctx.intern("receipt", record["generation"])})
        obs["target"] = {"ranks": ranks}
        obs["after"] = _after(ctx, obs)
    return obs


def _after(ctx: ScenarioContext, obs: dict[str, Any]) -> dict[str, Any]:
    """Re-resolve the pointer after the restart: same bytes, same receipt, no new generation."""
    store = ctx.store
    receipt = None
    try:
        receipt = ctx.intern("receipt", store.resolve().digest)
    except ReceiptMismatch as exc:
        failures = "; ".join(map(str, exc.failures))
        obs["errors"].append(
            f"post-restart: the committed generation no longer verifies: {failures}"
        )
    except StoreError as exc:
        obs["errors"].append("post-restart: the pointer or its receipt can no longer be read")
        ctx.notes.append(str(exc))
    return {
        "pointer": ctx.pointer_label(),
        "receipt": receipt,
        "generations": len(store.generation_names()),
    }


def _torchrun(ctx: ScenarioContext, pool: WorkerPool) -> tuple[int, bool, list[str]]:
    """torchrun's exit code, whether it timed out, and what its ranks left running."""
    workdir, timeout = ctx.workdir, pool.timeout
    payload: Elastic = {
        "shape": ctx.run_plan.shape,
        "dying_rank": plan.DYING_RANK,
        "exit_code": plan.ELASTIC_EXIT_CODE,
        "fixture": ctx.fixture,
        "fixture_args": ctx.run_plan.arguments,
        "store": STORE_ROOT,
        "timeout": timeout,
    }
    worker.prepare_workdir(workdir)
    (workdir / plan.ELASTIC_PAYLOAD_FILE).write_text(json.dumps(payload), encoding="utf-8")
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
    if sys.platform != "win32":  # Windows' multiprocessing makes no AF_UNIX sockets
        env[worker.MULTIPROCESSING_TEMP_ENV] = multiprocessing.util.get_temp_dir()
    # torch's agent starts each rank in a session of its own; the token finds them, and what
    # they start, when the job ends (:mod:`dcp_invariant.suite.reaper`).
    env[reaper.GROUP_ENV] = reaper.group_mark(os.path.realpath(workdir), TORCHRUN_GROUP)
    # Workers are fresh interpreters: give them this very package and, as multiprocessing does
    # for its spawned children, the runner's import path, where the fixture module was found.
    package_parent = str(Path(dcp_invariant.__file__).resolve().parent.parent)
    search = [package_parent] + [str(Path(p).resolve()) for p in sys.path if p and Path(p).is_dir()]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(search))
    with open(workdir / LOG_FILE, "wb") as log:
        proc = subprocess.Popen(
            command,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            **_new_process_group(),
        )
        pool.track(proc)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(proc)
            return proc.wait(), True, []  # what was left is the stopped job, not a straggler
        finally:
            # The agent has reaped its ranks once it exits: anything still carrying the job's
            # token was left behind by a rank. Killed here, with the agent's own process group.
            left = reap_group(workdir, TORCHRUN_GROUP, {proc.pid})
            kill_process_tree(proc)
            pool.untrack(proc)
        return code, False, left


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
