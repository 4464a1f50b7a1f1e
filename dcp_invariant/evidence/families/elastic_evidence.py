"""The elastic family: torchrun restarts a job after a rank exits, and it resumes the committed
generation."""

from __future__ import annotations

from dcp_invariant import plan, runtimes
from dcp_invariant.evidence.checks import (
    Check,
    boolean,
    integer,
    label,
    list_of,
    one_of,
    optional,
    record,
    string,
)
from dcp_invariant.evidence.families._fixture_arms import left_running
from dcp_invariant.evidence.families._groups import rank_set, timed_out
from dcp_invariant.evidence.families._promotion import commit_at_baseline, committed
from dcp_invariant.evidence.families._record_parts import (
    Obs,
    commit,
    common_fields,
    digests,
    exit_code,
    group,
    hex64,
    load_fields,
    step,
)
from dcp_invariant.evidence.families._training_source import (
    lost_at_load,
    resumed,
    saved_and_stepped,
    source_sightings,
    training_source_rank,
)

elastic_target_rank = record(
    **load_fields,
    loaded=optional(digests),
    next=optional(step),
    restart_count=integer(0),
    max_restarts=integer(0),
    master_addr_loopback=boolean,
)


attestation = record(
    create_tcp_store_bytes=integer(0),
    create_tcp_store_sha256=hex64,
    listen=one_of("127.0.0.1", "torch-default"),
    shared_rendezvous_store_disabled=boolean,
    stores_built=integer(0),
    tcp_store_pristine=boolean,
    torch_distribution=string,
    torch_runtime=string,
    use_libuv=boolean,
)


_elastic_fields: dict[str, Check] = {
    **common_fields,
    "fixture": string,
    "steps_before_save": integer(0),
    "source": group(training_source_rank),
    "commit": optional(commit),
    "launcher": optional(
        record(
            arguments=list_of(string, 16),
            exit_code=exit_code,
            timed_out=boolean,
            guard=optional(attestation),
        )
    ),
    "failure_marker": optional(record(attempt=integer(0), exit_code=exit_code, rank=integer(0))),
    "target": optional(record(ranks=list_of(elastic_target_rank, 8))),
    "after": optional(
        record(
            pointer=optional(label("pointer")),
            receipt=optional(label("receipt")),
            generations=integer(0),
        )
    ),
}

SHAPE = record(**_elastic_fields)

# The elastic scenario of a fixture run records, like the other fixture families, what its groups
# (torchrun's ranks among them) left running.
FIXTURE_SHAPE = record(**_elastic_fields, left_running=left_running)


def shape_for(run_plan: plan.Plan) -> Check:
    return FIXTURE_SHAPE if run_plan.kind == "fixture" else SHAPE


def rule(scenario: plan.Scenario, obs: Obs) -> list[str]:
    reasons, saved, reference = saved_and_stepped(obs, scenario.source_world_size)
    commit = obs["commit"]
    if commit is None:
        return [*reasons, "commit: did not run"]
    reasons += committed(commit, scenario)
    launcher = obs["launcher"]
    if launcher is None:
        return [*reasons, "torchrun: did not run"]
    arguments = launcher["arguments"]
    if arguments != list(plan.TORCHRUN_ARGUMENTS):
        reasons.append(
            f"torchrun: launched with {' '.join(arguments)}, "
            f"not {' '.join(plan.TORCHRUN_ARGUMENTS)}"
        )
    if launcher["timed_out"]:
        reasons.append(timed_out("torchrun (the restarted job)"))
    elif launcher["exit_code"] != 0:
        reasons.append(f"torchrun: exited with code {launcher['exit_code']} after the restart")
    reasons += _guard(launcher["guard"])
    marker = obs["failure_marker"]
    expected_marker = {"attempt": 0, "exit_code": plan.ELASTIC_EXIT_CODE, "rank": plan.DYING_RANK}
    if marker != expected_marker:
        reasons.append(f"failure marker: expected {expected_marker}, got {marker}")
    target = obs["target"]
    ranks = target["ranks"] if target is not None else []
    reasons += rank_set(ranks, scenario.target_world_size, "restarted group")

    user_fixture = "left_running" in obs  # FIXTURE_SHAPE: a user's fixture, not the registered
    lost = {
        r["rank"]
        for r in ranks
        if lost_at_load(
            r,
            saved.get(r["rank"]),
            reference.get(r["rank"]),
            saved.get(0),
            user_fixture=user_fixture,
        )
    }
    for rank in ranks:
        where = f"restarted rank {rank['rank']}"
        if rank["restart_count"] != 1:
            reasons.append(f"{where}: TORCHELASTIC_RESTART_COUNT is {rank['restart_count']}, not 1")
        if rank["max_restarts"] != 1:
            reasons.append(f"{where}: TORCHELASTIC_MAX_RESTARTS is {rank['max_restarts']}, not 1")
        if not rank["master_addr_loopback"]:
            reasons.append(f"{where}: the rendezvous address was not numeric loopback")
        # Each restarted rank resumes its own state: per-rank state need not be replicated.
        r = rank["rank"]
        reasons += resumed(
            rank,
            commit,
            saved.get(r),
            reference.get(r),
            where,
            scenario,
            rank_0s=saved.get(0),
            others_lost=bool(lost - {r}),
            user_fixture=user_fixture,
        )
    after = obs["after"]
    if after is None:
        return [*reasons, "post-restart check: did not run"]
    if after["pointer"] != commit["pointer_after"]:
        reasons.append("post-restart: the pointer changed during the elastic restart")
    if after["receipt"] != commit["receipt"]:
        reasons.append("post-restart: the generation's receipt digest changed")
    if after["generations"] != commit["generations_after"]:
        reasons.append("post-restart: a generation was promoted after the failure")
    return reasons


def _guard(attestation: Obs | None) -> list[str]:
    if attestation is None:
        return [
            "torchrun guard: no attestation; the rendezvous store was not built under the guard"
        ]
    reasons = []
    runtime = runtimes.find(attestation["torch_distribution"], attestation["torch_runtime"])
    if runtime is None:
        reasons.append(
            f"torchrun guard: runtime {attestation['torch_distribution']}/{attestation['torch_runtime']} "
            "is not registered"
        )
    elif (attestation["create_tcp_store_sha256"], attestation["create_tcp_store_bytes"]) != (
        runtime.create_tcp_store_sha256,
        runtime.create_tcp_store_bytes,
    ):
        reasons.append("torchrun guard: _create_tcp_store source is not the registered one")
    if not attestation["tcp_store_pristine"]:
        reasons.append("torchrun guard: the module-local TCPStore was not pristine")
    if attestation["use_libuv"]:
        reasons.append("torchrun guard: the rendezvous store was built with libuv")
    if not attestation["shared_rendezvous_store_disabled"]:
        reasons.append("torchrun guard: TORCH_DISABLE_SHARE_RDZV_TCP_STORE was not set")
    if attestation["stores_built"] < 1:
        reasons.append("torchrun guard: no rendezvous store was built")
    elif attestation["stores_built"] > 1:
        # The agent builds its rendezvous store once and keeps it across the restart.
        reasons.append(
            f"torchrun guard: {attestation['stores_built']} rendezvous stores were built; the "
            "agent builds one and keeps it across the restart"
        )
    return reasons


commits = commit_at_baseline
sightings = source_sightings
