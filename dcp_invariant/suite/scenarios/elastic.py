"""elastic_restart_2_to_2: torchrun restarts a failed 2-rank job; it resumes the committed generation.

The launch goes through torch's own launcher (``torch.distributed.run``), guarded by
:mod:`dcp_invariant.suite.torchrun.launch`, in its own process group so a timeout reaps the agent and
every worker it started (:mod:`dcp_invariant.suite.torchrun.agent`).
"""

from __future__ import annotations

import json
from typing import Any

from dcp_invariant import canonical, plan
from dcp_invariant.commit import ReceiptMismatch, StoreError
from dcp_invariant.suite import worker
from dcp_invariant.suite.scenarios.common import STORE_ROOT, ScenarioContext
from dcp_invariant.suite.scenarios.host import PoolHost
from dcp_invariant.suite.scenarios.payloads import Elastic
from dcp_invariant.suite.torchrun.agent import ATTESTATION_FILE, LOG_FILE, TORCHRUN_GROUP, Agent
from dcp_invariant.suite.torchrun.elastic_rank import MARKER_FILE, attempt_group

RESUMED_GROUP = attempt_group(1)  # the ranks torchrun starts again after the planned exit


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
        exit_code, timed_out, left = _torchrun(ctx, ctx.host)
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


def _torchrun(ctx: ScenarioContext, host: PoolHost) -> tuple[int, bool, list[str]]:
    """torchrun's exit code, whether it timed out, and what its ranks left running: the
    runner's agent, started ahead of need in this workdir, or one started now."""
    workdir = ctx.workdir
    payload: Elastic = {
        "shape": ctx.run_plan.shape,
        "dying_rank": plan.DYING_RANK,
        "exit_code": plan.ELASTIC_EXIT_CODE,
        "fixture": ctx.fixture,
        "fixture_args": ctx.run_plan.arguments,
        "store": STORE_ROOT,
        "timeout": host.pool.timeout,
    }
    ready = host.agent
    if ready is not None and ready.workdir == workdir and ready.usable():
        agent = ready
    else:
        agent = Agent(host.pool, workdir)
    (workdir / plan.ELASTIC_PAYLOAD_FILE).write_text(json.dumps(payload), encoding="utf-8")
    return agent.run(host.pool.timeout)
