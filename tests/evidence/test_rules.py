"""The rules: each scenario's real observation passes, and each way it can go wrong fails.

Every mutation keeps the observation's shape valid (asserted), so what decides the verdict is
the rule, not the shape check in front of it. The substrings asserted come from the rules'
own messages.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import pytest
from artifact_data import DATA_ARTIFACT, read_observations
from forge import reaggregate

from dcp_invariant import dcp_layout, plan
from dcp_invariant.evidence import diagnosis, observation, rules

Obs = dict[str, Any]
REAL: dict[str, Obs] = read_observations(DATA_ARTIFACT)
OTHER_HEX = "0" * 64
OTHER_LOSS = "0x1.0000000000000p-1"


def real(name: str) -> Obs:
    return copy.deepcopy(REAL[name])


@dataclass(frozen=True)
class Mutation:
    id: str
    mutate: Callable[[Obs], None]
    text: str
    applies: Callable[[plan.Scenario], bool] = lambda scenario: True


def two_source_ranks(scenario: plan.Scenario) -> bool:
    return scenario.source_world_size == 2


def setter(*path: Any, value: Any) -> Callable[[Obs], None]:
    def mutate(obs: Obs) -> None:
        target = obs
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return mutate


def last_target(obs: Obs) -> Obs:
    return cast(Obs, obs["target"]["ranks"][-1])


def _on_last_target(change: Callable[[Obs], None]) -> Callable[[Obs], None]:
    return lambda obs: change(last_target(obs))


def _rng_loaded(rank: Obs) -> None:
    rank["loaded"]["rng"] = OTHER_HEX


def _model_loaded(rank: Obs) -> None:
    rank["loaded"]["model"] = OTHER_HEX


def _cursor_dropped(rank: Obs) -> None:
    del rank["loaded"]["cursor"]


def _extra_component(rank: Obs) -> None:
    rank["loaded"]["extra"] = OTHER_HEX


def _resumed_loss(rank: Obs) -> None:
    rank["next"]["loss"] = OTHER_LOSS


def _resumed_optimizer(rank: Obs) -> None:
    rank["next"]["digests"]["optimizer"] = OTHER_HEX


def _source_saves_disagree(obs: Obs) -> None:
    obs["source"]["ranks"][1]["saves"][-1]["model"] = OTHER_HEX


def _source_next_disagrees(obs: Obs) -> None:
    obs["source"]["ranks"][1]["next"]["loss"] = OTHER_LOSS


def _pointer_stays(obs: Obs, key: str = "commit") -> None:
    obs[key]["pointer_after"] = obs[key]["pointer_before"]


def _unpromoted(key: str) -> Callable[[Obs], None]:
    def mutate(obs: Obs) -> None:
        obs[key]["promoted"] = False
        obs[key]["refused"] = [{"path": "__0_0.distcp", "reason": "digest"}]

    return mutate


def _no_metadata(obs: Obs) -> None:
    obs["commit"]["files"] = [f for f in obs["commit"]["files"] if f["path"] != ".metadata"]


def _extra_generation(obs: Obs) -> None:
    obs["commit"]["generations_after"] += 1


def _drop_last_target_rank(obs: Obs) -> None:
    obs["target"]["ranks"].pop()


def _drop_first_save(obs: Obs) -> None:
    obs["source"]["ranks"][0]["saves"] = []


# Resuming from the committed generation: training and elastic share these checks.
RESUME = [
    Mutation("loaded rng differs", _on_last_target(_rng_loaded), "component 'rng' differs"),
    Mutation("loaded model differs", _on_last_target(_model_loaded), "component 'model' differs"),
    Mutation("loaded component missing", _on_last_target(_cursor_dropped), "'cursor' is missing"),
    Mutation(
        "loaded extra component", _on_last_target(_extra_component), "unexpected component 'extra'"
    ),
    Mutation(
        "resumed loss differs", _on_last_target(_resumed_loss), f"resumed step loss {OTHER_LOSS}"
    ),
    Mutation(
        "resumed step state differs",
        _on_last_target(_resumed_optimizer),
        "after the resumed step: component 'optimizer'",
    ),
    Mutation(
        "loaded nothing",
        _on_last_target(setter("loaded", value=None)),
        "did not load and step",
    ),
    Mutation(
        "loaded another generation",
        _on_last_target(setter("generation", value="receipt-2")),
        "loaded generation receipt-2, not the committed receipt-1",
    ),
    Mutation(
        "unverified before load",
        _on_last_target(setter("verified_before_load", value=False)),
        "verification failed before load",
    ),
    Mutation(
        "unverified after load",
        _on_last_target(setter("verified_after_load", value=False)),
        "verification failed after load",
    ),
    Mutation("source did not save", _drop_first_save, "did not save once and step as planned"),
    Mutation(
        "source exit code nonzero",
        setter("source", "exit_codes", 0, value=1),
        "source rank 0: exited with code 1",
    ),
    Mutation(
        "source timed out", setter("source", "timed_out", value=True), "timeout: source: timed out"
    ),
    Mutation(
        "commit not promoted", _unpromoted("commit"), "was not promoted (__0_0.distcp: digest)"
    ),
    Mutation("commit not sealed", setter("commit", "sealed", value=False), "was not sealed"),
    Mutation("pointer did not move", _pointer_stays, "the pointer did not move"),
    Mutation("two generations added", _extra_generation, "exactly one generation"),
    Mutation(
        "candidate left behind",
        setter("commit", "candidate_retained", value=True),
        "candidate directory was left behind",
    ),
    Mutation("generation without .metadata", _no_metadata, "lacks .metadata"),
    Mutation("commit did not run", setter("commit", value=None), "commit: did not run"),
    Mutation("worker error", setter("errors", value=["worker crashed"]), "error: worker crashed"),
]

TRAINING = [
    *RESUME,
    # The registered fixture's state is replicated and these scenarios reshard it.
    Mutation(
        "source saves disagree",
        _source_saves_disagree,
        "source: saved state: ranks disagree",
        two_source_ranks,
    ),
    Mutation(
        "source next steps disagree",
        _source_next_disagrees,
        "source: uninterrupted next step: ranks disagree",
        two_source_ranks,
    ),
    Mutation(
        "promoted without a receipt",
        setter("commit", "receipt", value=None),
        "promoted without a clean receipt",
    ),
    Mutation(
        "target exit code nonzero",
        setter("target", "exit_codes", 0, value=1),
        "target rank 0: exited with code 1",
    ),
    Mutation(
        "target timed out", setter("target", "timed_out", value=True), "timeout: target: timed out"
    ),
    Mutation(
        "target rank missing",
        _drop_last_target_rank,
        "a rank exited without reporting: target rank ",
    ),
    Mutation("target did not run", setter("target", value=None), "target: did not run"),
]


def _without_argument(argument: str) -> Callable[[Obs], None]:
    def mutate(obs: Obs) -> None:
        obs["launcher"]["arguments"].remove(argument)

    return mutate


def guard(key: str, value: Any) -> Callable[[Obs], None]:
    return setter("launcher", "guard", key, value=value)


ELASTIC = [
    *RESUME,
    Mutation(
        "restart count 0",
        _on_last_target(setter("restart_count", value=0)),
        "TORCHELASTIC_RESTART_COUNT is 0",
    ),
    Mutation(
        "max restarts 2",
        _on_last_target(setter("max_restarts", value=2)),
        "TORCHELASTIC_MAX_RESTARTS is 2",
    ),
    Mutation(
        "rendezvous not on loopback",
        _on_last_target(setter("master_addr_loopback", value=False)),
        "not numeric loopback",
    ),
    Mutation(
        "marker with another exit code",
        setter("failure_marker", "exit_code", value=1),
        "failure marker: expected",
    ),
    Mutation(
        "marker from another rank", setter("failure_marker", "rank", value=0), "failure marker"
    ),
    Mutation("no marker", setter("failure_marker", value=None), "failure marker"),
    Mutation("no guard attestation", setter("launcher", "guard", value=None), "no attestation"),
    Mutation("libuv store", guard("use_libuv", True), "built with libuv"),
    Mutation(
        "unregistered store source",
        guard("create_tcp_store_sha256", OTHER_HEX),
        "source is not the registered one",
    ),
    Mutation(
        "unregistered store source size",
        guard("create_tcp_store_bytes", 2192),
        "source is not the registered one",
    ),
    Mutation(
        "unregistered runtime",
        guard("torch_distribution", "0.0.0"),
        "0.0.0/2.13.0+cpu is not registered",
    ),
    Mutation("store not pristine", guard("tcp_store_pristine", False), "was not pristine"),
    Mutation(
        "shared rendezvous store",
        guard("shared_rendezvous_store_disabled", False),
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    ),
    Mutation("no store built", guard("stores_built", 0), "no rendezvous store was built"),
    Mutation(
        "torchrun exit code 1",
        setter("launcher", "exit_code", value=1),
        "torchrun: exited with code 1",
    ),
    Mutation(
        "torchrun timed out",
        setter("launcher", "timed_out", value=True),
        "timeout: torchrun (the restarted job): timed out",
    ),
    Mutation(
        "torchrun without --max-restarts",
        _without_argument("--max-restarts=1"),
        "not --standalone --local-addr=127.0.0.1 --nnodes=1 --nproc-per-node=2 --max-restarts=1",
    ),
    Mutation(
        "torchrun without --local-addr",
        _without_argument("--local-addr=127.0.0.1"),
        "not --standalone --local-addr=127.0.0.1 --nnodes=1 --nproc-per-node=2 --max-restarts=1",
    ),
    Mutation(
        "torchrun restart count overridden later on the command line",
        lambda obs: obs["launcher"]["arguments"].append("--max_restarts=5"),
        "torchrun: launched with",
    ),
    Mutation("torchrun did not run", setter("launcher", value=None), "torchrun: did not run"),
    Mutation(
        "pointer moved during restart",
        setter("after", "pointer", value="pointer-2"),
        "pointer changed during the elastic restart",
    ),
    Mutation(
        "receipt changed during restart",
        setter("after", "receipt", value="receipt-2"),
        "receipt digest changed",
    ),
    Mutation(
        "generation added during restart",
        setter("after", "generations", value=2),
        "promoted after the failure",
    ),
    Mutation(
        "no post-restart check", setter("after", value=None), "post-restart check: did not run"
    ),
    Mutation(
        "restarted rank missing", _drop_last_target_rank, "restarted group: reports from ranks"
    ),
    Mutation(
        "no restarted group", setter("target", value=None), "restarted group: reports from ranks []"
    ),
]


def _bad_target_shape(obs: Obs) -> None:
    obs["target"]["ranks"][0]["local_shape"] = [5, 3]


def _bad_source_shape(obs: Obs) -> None:
    obs["source"]["ranks"][0]["local_shape"] = [1, 3]


def _taller_tensor(obs: Obs) -> None:
    # The expected shard shapes follow global_shape, so the real shards no longer fit.
    obs["global_shape"] = [obs["global_shape"][0] + 1, *obs["global_shape"][1:]]


def _source_digests_disagree(obs: Obs) -> None:
    obs["source"]["ranks"][1]["global_digest"] = OTHER_HEX


DTENSOR = [
    Mutation("plan changed", setter("global_shape", value=[8, 3]), "plan: tested"),
    Mutation("placement changed", setter("placement", value="Replicate()"), "plan: tested"),
    Mutation(
        "target shard shape", _bad_target_shape, "target rank 0: local shard shape [5, 3], expected"
    ),
    Mutation(
        "source shard shape", _bad_source_shape, "source rank 0: local shard shape [1, 3], expected"
    ),
    Mutation("global shape changed", _taller_tensor, "local shard shape"),
    Mutation(
        "target global digest differs",
        _on_last_target(setter("global_digest", value=OTHER_HEX)),
        "reconstructed global tensor differs",
    ),
    Mutation(
        "target global digest missing",
        _on_last_target(setter("global_digest", value=None)),
        "reconstructed global tensor differs",
    ),
    Mutation(
        "target shard not reported",
        _on_last_target(setter("local_shape", value=None)),
        "reported no local shard",
    ),
    Mutation(
        "source digests disagree",
        _source_digests_disagree,
        "source: global tensor digest: ranks disagree",
        two_source_ranks,
    ),
    Mutation(
        "loaded another generation",
        _on_last_target(setter("generation", value="receipt-2")),
        "not the committed receipt-1",
    ),
    Mutation(
        "unverified before load",
        _on_last_target(setter("verified_before_load", value=False)),
        "verification failed before load",
    ),
    Mutation("commit not promoted", _unpromoted("commit"), "was not promoted"),
    Mutation("pointer did not move", _pointer_stays, "the pointer did not move"),
    Mutation("commit did not run", setter("commit", value=None), "commit: did not run"),
    Mutation(
        "target exit code nonzero",
        setter("target", "exit_codes", 0, value=1),
        "target rank 0: exited with code 1",
    ),
    Mutation("target did not run", setter("target", value=None), "target: did not run"),
    Mutation(
        "source timed out", setter("source", "timed_out", value=True), "timeout: source: timed out"
    ),
]


def _candidate_has_metadata(obs: Obs) -> None:
    obs["candidate"]["files"].append({"path": ".metadata", "size": 1})


def _baseline_disagrees(obs: Obs) -> None:
    obs["source"]["ranks"][1]["saves"][0]["model"] = OTHER_HEX


def _dying_rank_exits_cleanly(obs: Obs) -> None:
    obs["source"]["exit_codes"][obs["dying_rank"]] = 0


# Refusal without side effects: shared by the crashed save and the damaged candidates.
REFUSAL = [
    Mutation(
        "candidate promoted",
        setter("candidate", "promoted", value=True),
        "candidate: step-4 was promoted",
    ),
    Mutation(
        "pointer moved",
        setter("candidate", "pointer_after", value="pointer-2"),
        "candidate: the pointer moved",
    ),
    Mutation(
        "pointer not the baseline's",
        setter("candidate", "pointer_before", value="pointer-2"),
        "the pointer was not the baseline's",
    ),
    Mutation(
        "generation added",
        setter("candidate", "generations_after", value=2),
        "a generation was added",
    ),
    Mutation(
        "candidate not retained",
        setter("candidate", "candidate_retained", value=False),
        "not kept for inspection",
    ),
    Mutation("load attempted", setter("load_attempted", value=True), "a DCP load was attempted"),
    Mutation("baseline not promoted", _unpromoted("baseline"), "baseline: step-3 was not promoted"),
    Mutation(
        "baseline pointer did not move",
        lambda obs: _pointer_stays(obs, "baseline"),
        "baseline: the pointer did not move",
    ),
    # Without a baseline the driver never made the candidate either.
    Mutation(
        "baseline did not run",
        lambda obs: obs.update(baseline=None, candidate=None),
        "baseline: did not run",
    ),
    Mutation("candidate did not run", setter("candidate", value=None), "candidate: did not run"),
    Mutation("worker error", setter("errors", value=["worker crashed"]), "error: worker crashed"),
]

RANK_EXIT = [
    *REFUSAL,
    Mutation(
        "dying rank exit code 0", _dying_rank_exits_cleanly, "source rank 1: exit code 0, expected"
    ),
    Mutation(
        "one exit code for two ranks",
        setter("source", "exit_codes", value=[1]),
        "1 exit codes for 2 ranks",
    ),
    Mutation("candidate sealed", setter("candidate", "sealed", value=True), "candidate was sealed"),
    Mutation(
        "candidate without a seal error",
        setter("candidate", "seal_error", value=None),
        "candidate was sealed",
    ),
    Mutation("candidate has .metadata", _candidate_has_metadata, "left a .metadata commit marker"),
    Mutation("baseline saves disagree", _baseline_disagrees, "baseline: ranks disagree"),
    Mutation(
        "source rank missing",
        lambda obs: obs["source"]["ranks"].pop(),
        "source: reports from ranks",
    ),
    # The observation may not choose its own plan: the scenario defines who dies, and how.
    Mutation("plan names another rank", setter("dying_rank", value=0), "plan: rank 0 was to exit"),
    Mutation("plan names another code", setter("planned_exit_code", value=1), "code 86"),
    Mutation(
        "source timed out", setter("source", "timed_out", value=True), "timeout: source: timed out"
    ),
    Mutation(
        "peer finished the save",
        setter("source", "exit_codes", 0, value=0),
        "exited 0 although a peer died",
    ),
]


def _refusal_forgets_damage(obs: Obs) -> None:
    obs["candidate"]["refused"] = [
        f for f in obs["candidate"]["refused"] if f["path"] != obs["damage"]["path"]
    ]


def _refusal_for_another_reason(obs: Obs) -> None:
    other = {"missing": "digest", "digest": "missing"}
    obs["candidate"]["refused"] = [
        {"path": f["path"], "reason": other[f["reason"]]} for f in obs["candidate"]["refused"]
    ]


def _damage_of_another_kind(obs: Obs) -> None:
    obs["damage"]["kind"] = {"remove": "flip", "flip": "remove"}[obs["damage"]["kind"]]


def _damage_elsewhere(obs: Obs) -> None:
    obs["damage"]["path"] = "__9_0.distcp"


def _damage_other_file(obs: Obs) -> None:
    obs["damage"]["path"] = "__1_0.distcp" if obs["scenario"] == "missing_metadata" else ".metadata"


def _damage_offset_toggled(obs: Obs) -> None:
    obs["damage"]["offset"] = 7 if obs["damage"]["offset"] is None else None


def _candidate_reuses_baseline_receipt(obs: Obs) -> None:
    obs["candidate"]["receipt"] = obs["baseline"]["receipt"]


DAMAGED = [
    *REFUSAL,
    Mutation(
        "refusal misses the damaged file", _refusal_forgets_damage, "promotion did not report"
    ),
    Mutation("refusal for another reason", _refusal_for_another_reason, "promotion did not report"),
    Mutation("damage of the wrong kind", _damage_of_another_kind, "damage: expected a"),
    Mutation(
        "damage outside the receipt",
        _damage_elsewhere,
        "__9_0.distcp was not in the sealed receipt",
    ),
    Mutation(
        "candidate never sealed", setter("candidate", "sealed", value=False), "was never sealed"
    ),
    Mutation(
        "candidate reuses the baseline receipt",
        _candidate_reuses_baseline_receipt,
        "same receipt as the baseline",
    ),
    Mutation(
        "source exit code nonzero",
        setter("source", "exit_codes", 1, value=1),
        "source rank 1: exited with code 1",
    ),
    Mutation(
        "source timed out", setter("source", "timed_out", value=True), "timeout: source: timed out"
    ),
    Mutation("damage hit the wrong kind of file", _damage_other_file, "damage: hit"),
    Mutation("damage offset inconsistent", _damage_offset_toggled, "a flip needs the offset"),
]

BY_FAMILY = {
    "training": TRAINING,
    "dtensor": DTENSOR,
    "elastic": ELASTIC,
    "rank_exit": RANK_EXIT,
    "damaged": DAMAGED,
}

CASES = [
    pytest.param(scenario.name, m, id=f"{scenario.name}: {m.id}")
    for scenario in plan.SCENARIOS
    for m in BY_FAMILY[scenario.family]
    if m.applies(scenario)
]


def test_every_scenario_has_mutations() -> None:
    covered = {case.values[0] for case in CASES}
    assert covered == set(plan.SCENARIO_NAMES)


@pytest.mark.parametrize("name", plan.SCENARIO_NAMES)
def test_real_observation_passes(name: str) -> None:
    obs = real(name)
    assert observation.validate(name, obs, run_plan=plan.REGISTERED) == []
    assert rules.derive(name, obs, run_plan=plan.REGISTERED) == []
    assert rules.result_record(name, obs, run_plan=plan.REGISTERED)["verdict"] == "pass"


@pytest.mark.parametrize(("name", "mutation"), CASES)
def test_mutation_fails_the_scenario(name: str, mutation: Mutation) -> None:
    obs = real(name)
    mutation.mutate(obs)
    reaggregate(obs)  # a forger re-derives what the verifier derives
    assert obs != REAL[name], "the mutation changed nothing"
    assert observation.validate(name, obs, run_plan=plan.REGISTERED) == [], (
        "the mutation broke the shape, not the rule"
    )

    reasons = rules.derive(name, obs, run_plan=plan.REGISTERED)

    assert any(mutation.text in r for r in reasons), reasons
    record = rules.result_record(name, obs, run_plan=plan.REGISTERED)
    assert record["verdict"] == "fail"
    assert record["reasons"] == reasons


def test_summary_counts_the_failures() -> None:
    results = {
        n: rules.result_record(n, real(n), run_plan=plan.REGISTERED) for n in plan.SCENARIO_NAMES
    }
    broken = real("missing_shard")
    broken["load_attempted"] = True
    results["missing_shard"] = rules.result_record(
        "missing_shard", broken, run_plan=plan.REGISTERED
    )

    summary = rules.summary_record(results, run_plan=plan.REGISTERED)

    assert summary["verdict"] == "fail"
    assert (summary["passed"], summary["failed"], summary["total"]) == (10, 1, 11)
    assert [s["scenario"] for s in summary["scenarios"]] == list(plan.SCENARIO_NAMES)
    assert {s["scenario"] for s in summary["scenarios"] if s["verdict"] == "fail"} == {
        "missing_shard"
    }


def test_out_of_range_dying_rank_is_a_reason() -> None:
    obs = real("rank_exit_no_promotion")
    obs["dying_rank"] = 2
    assert observation.validate("rank_exit_no_promotion", obs, run_plan=plan.REGISTERED) == []

    assert rules.derive("rank_exit_no_promotion", obs, run_plan=plan.REGISTERED) != []


def _per_rank_elastic() -> Obs:
    """The elastic observation with state that differs by rank, saved and resumed per rank."""
    obs = real("elastic_restart_2_to_2")
    source_1 = obs["source"]["ranks"][1]
    source_1["saves"][-1]["data"] = OTHER_HEX
    source_1["next"]["digests"]["data"] = OTHER_HEX
    source_1["next"]["loss"] = OTHER_LOSS
    target_1 = next(r for r in obs["target"]["ranks"] if r["rank"] == 1)
    target_1["loaded"]["data"] = OTHER_HEX
    target_1["next"]["digests"]["data"] = OTHER_HEX
    target_1["next"]["loss"] = OTHER_LOSS
    for rank in (*obs["source"]["ranks"], *obs["target"]["ranks"]):
        if rank is not source_1 and rank is not target_1:
            for digests in (*rank.get("saves", []), rank.get("loaded"), rank["next"]["digests"]):
                if digests is not None:
                    digests["data"] = "1" * 64
    reaggregate(obs)
    assert observation.validate("elastic_restart_2_to_2", obs, run_plan=plan.REGISTERED) == []
    return obs


def test_elastic_checks_each_rank_against_its_own_state() -> None:
    # Per-rank state that is not a DTensor (a data loader keyed by rank, say) is legitimate:
    # each restarted rank resumes what its own source rank saved.
    obs = _per_rank_elastic()
    assert rules.derive("elastic_restart_2_to_2", obs, run_plan=plan.REGISTERED) == []


def _resumed_rank_0s_data(obs: Obs, moved: bool, how: str = "loss and state") -> None:
    """Restarted rank 1 loads rank 0's value (what a key shared by all ranks gives) and, if
    ``moved``, takes a step that differs from its uninterrupted one (``how``)."""
    target_1 = next(r for r in obs["target"]["ranks"] if r["rank"] == 1)
    target_1["loaded"]["data"] = "1" * 64
    if moved and how != "loss":
        target_1["next"]["digests"]["data"] = "2" * 64
    if moved and how != "state":
        target_1["next"]["loss"] = "0x1.8000000000000p-1"
    reaggregate(obs)


@pytest.mark.parametrize("how", ["loss and state", "loss", "state"])
def test_elastic_names_a_rank_that_resumed_anothers_state(how: str) -> None:
    obs = _per_rank_elastic()
    _resumed_rank_0s_data(obs, moved=True, how=how)

    reasons = rules.derive("elastic_restart_2_to_2", obs, run_plan=plan.REGISTERED)

    assert reasons, "rank 1 resumed rank 0's state"
    assert all(r.startswith(diagnosis.ROUND_TRIP) for r in reasons), reasons
    assert any("restarted rank 1: after load: component 'data'" in r for r in reasons), reasons


def test_elastic_passes_a_rank_given_anothers_copy_that_its_step_overwrites() -> None:
    # DDP's BatchNorm buffers, saved by rank 0 alone (Fabric) or kept as one copy (DCP): rank 1
    # resumes rank 0's, and DDP's forward broadcasts rank 0's anyway; the step matches.
    obs = _per_rank_elastic()
    _resumed_rank_0s_data(obs, moved=False)
    assert rules.derive("elastic_restart_2_to_2", obs, run_plan=plan.REGISTERED) == []


@pytest.mark.parametrize(
    ("rank", "value"),
    [(1, "3" * 64), (0, OTHER_HEX)],
    ids=["a copy no rank saved", "rank 0 holding rank 1's"],
)
def test_elastic_names_a_load_that_is_not_rank_0s_copy_on_another_rank(
    rank: int, value: str
) -> None:
    # Lost, whatever the step did: only rank 0's copy, on another rank, is what DDP's broadcast
    # makes good; rank 0 holding rank 1's saved value is a load applied late whose fresh value
    # is what another rank saved.
    obs = _per_rank_elastic()
    next(r for r in obs["target"]["ranks"] if r["rank"] == rank)["loaded"]["data"] = value
    reaggregate(obs)
    reasons = rules.derive("elastic_restart_2_to_2", obs, run_plan=plan.REGISTERED)
    assert reasons == [
        f"{diagnosis.ROUND_TRIP}: restarted rank {rank}: after load: component 'data' differs "
        "from the uninterrupted run"
    ]


def test_a_step_moved_by_another_ranks_lost_state_is_filed_under_that_loss() -> None:
    # DDP's BatchNorm: rank 1 resumes rank 0's per-rank buffers, and rank 0, whose own load was
    # whole, steps with it (an all-reduce, rank 0's buffers broadcast): its step differs too, and
    # nothing outside state_dict() is to blame.
    obs = _per_rank_elastic()
    _resumed_rank_0s_data(obs, moved=True)
    target_0 = next(r for r in obs["target"]["ranks"] if r["rank"] == 0)
    target_0["next"]["loss"] = OTHER_LOSS
    target_0["next"]["digests"]["model"] = OTHER_HEX
    reaggregate(obs)

    reasons = rules.derive("elastic_restart_2_to_2", obs, run_plan=plan.REGISTERED)

    moved, *also = [r for r in reasons if "restarted rank 0" in r]
    assert also == [
        f"{diagnosis.ROUND_TRIP}: restarted rank 0: after the resumed step: component 'model' "
        "differs from the uninterrupted run"
    ]
    assert moved.startswith(f"{diagnosis.ROUND_TRIP}: restarted rank 0: resumed step loss"), moved
    assert moved.endswith("a consequence of another rank's load (ranks step together)"), moved
    assert all(r.startswith(diagnosis.ROUND_TRIP) for r in reasons), reasons


def test_a_resharded_rank_moved_by_anothers_lost_state_is_filed_under_that_loss() -> None:
    obs = real("training_1_to_2")
    first, last = obs["target"]["ranks"][0], last_target(obs)
    last["loaded"]["data"] = OTHER_HEX
    first["next"]["loss"] = OTHER_LOSS
    reaggregate(obs)

    reasons = rules.derive("training_1_to_2", obs, run_plan=plan.REGISTERED)

    assert reasons and all(r.startswith(diagnosis.ROUND_TRIP) for r in reasons), reasons
    assert any(
        r.startswith(f"{diagnosis.ROUND_TRIP}: target rank 0: resumed step loss")
        and r.endswith("a consequence of another rank's load (ranks step together)")
        for r in reasons
    ), reasons


def test_a_resumed_step_that_differs_after_an_exact_load_is_state_outside_state_dict() -> None:
    obs = real("elastic_restart_2_to_2")
    last_target(obs)["next"]["loss"] = OTHER_LOSS
    reaggregate(obs)

    reasons = rules.derive("elastic_restart_2_to_2", obs, run_plan=plan.REGISTERED)

    assert reasons and all(r.startswith(diagnosis.OUTSIDE_STATE_DICT) for r in reasons), reasons


# --- Shard(0) row counts ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("rows", "world_size", "expected"),
    [
        (7, 1, [7]),
        (7, 2, [4, 3]),  # uneven: ceil-sized first, short tail
        (8, 2, [4, 4]),
        (10, 4, [3, 3, 3, 1]),
        (5, 4, [2, 2, 1, 0]),  # torch.chunk makes 3 chunks; the last rank is empty
        (1, 2, [1, 0]),
        (2, 3, [1, 1, 0]),
        (0, 2, [0, 0]),
    ],
)
def test_expected_shard_rows(rows: int, world_size: int, expected: list[int]) -> None:
    assert [
        dcp_layout.expected_shard_rows(rows, world_size, r) for r in range(world_size)
    ] == expected


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
def test_shards_cover_the_rows_exactly(world_size: int) -> None:
    for rows in range(0, 40):
        shards = [dcp_layout.expected_shard_rows(rows, world_size, r) for r in range(world_size)]
        chunk = -(-rows // world_size)
        assert sum(shards) == rows
        assert all(0 <= s <= chunk for s in shards)
        # Non-increasing: full chunks, then at most one short one, then empties.
        assert shards == sorted(shards, reverse=True)
        assert sum(0 < s < chunk for s in shards) <= 1


# --- observation shapes ----------------------------------------------------------------------


def _delete(*path: Any) -> Callable[[Obs], None]:
    def mutate(obs: Obs) -> None:
        target = obs
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return mutate


SHAPES = [
    (
        "training_1_to_1",
        "missing key",
        _delete("fixture"),
        "training_1_to_1: missing key 'fixture'",
    ),
    (
        "training_1_to_1",
        "nested missing key",
        _delete("commit", "sealed"),
        "training_1_to_1.commit: missing key 'sealed'",
    ),
    (
        "training_1_to_1",
        "unknown key",
        setter("extra", value=1),
        "training_1_to_1: unknown key 'extra'",
    ),
    (
        "training_1_to_1",
        "nested unknown key",
        setter("commit", "extra", value=1),
        "training_1_to_1.commit: unknown key 'extra'",
    ),
    (
        "training_1_to_1",
        "bool for an int",
        setter("steps_before_save", value=True),
        "steps_before_save: expected an integer, got bool",
    ),
    (
        "training_1_to_1",
        "bool for a rank",
        setter("source", "ranks", 0, "rank", value=False),
        "source.ranks[0].rank: expected an integer, got bool",
    ),
    (
        "training_1_to_1",
        "int for a bool",
        setter("commit", "sealed", value=1),
        "commit.sealed: expected true/false, got int",
    ),
    (
        "training_1_to_1",
        "negative count",
        setter("commit", "generations_after", value=-1),
        "expected an integer >= 0, got -1",
    ),
    (
        "training_1_to_1",
        "true for the schema version",
        setter("schema_version", value=True),
        "schema_version: expected one of [2, 7, 8], got True",
    ),
    (
        "training_1_to_1",
        "null for a string",
        setter("fixture", value=None),
        "fixture: expected a string, got null",
    ),
    (
        "training_1_to_1",
        "receipt-0 label",
        setter("commit", "receipt", value="receipt-0"),
        "a receipt label like 'receipt-1'",
    ),
    (
        "training_1_to_1",
        "zero-padded label",
        setter("commit", "receipt", value="receipt-01"),
        "a receipt label",
    ),
    (
        "training_1_to_1",
        "label of the wrong kind",
        setter("commit", "pointer_after", value="receipt-1"),
        "a pointer label",
    ),
    (
        "training_1_to_1",
        "digest in place of a label",
        setter("target", "ranks", 0, "generation", value=OTHER_HEX),
        "a receipt label",
    ),
    (
        "training_1_to_1",
        "decimal loss",
        setter("source", "ranks", 0, "next", "loss", value="0.25"),
        "a float in float.hex() form",
    ),
    (
        "training_1_to_1",
        "digests without aggregate",
        _delete("target", "ranks", 0, "loaded", "aggregate"),
        "loaded: missing key 'aggregate'",
    ),
    (
        "training_1_to_1",
        "bad component name",
        setter("target", "ranks", 0, "loaded", "a b", value=OTHER_HEX),
        "invalid component name 'a b'",
    ),
    (
        "training_1_to_1",
        "uppercase digest",
        setter("target", "ranks", 0, "loaded", "rng", value="A" * 64),
        "a 64-hex digest",
    ),
    (
        "training_1_to_1",
        "too many errors",
        setter("errors", value=["x"] * 65),
        "errors: more than 64 items",
    ),
    (
        "training_1_to_1",
        "wrong target world size",
        setter("target_world_size", value=2),
        "target_world_size: expected 1, got 2",
    ),
    ("dtensor_1_to_2", "string shape", setter("global_shape", value="7x3"), "expected a list"),
    (
        "missing_shard",
        "unknown damage kind",
        setter("damage", "kind", value="truncate"),
        "expected one of ['remove', 'flip']",
    ),
    (
        "missing_shard",
        "unknown failure reason",
        setter("candidate", "refused", 0, "reason", value="gone"),
        "expected one of",
    ),
    (
        "elastic_restart_2_to_2",
        "unknown listen address",
        setter("launcher", "guard", "listen", value="0.0.0.0"),
        "listen: expected one of ['127.0.0.1', 'torch-default']",
    ),
]


@pytest.mark.parametrize(
    ("name", "mutate", "text"), [pytest.param(n, m, t, id=i) for n, i, m, t in SHAPES]
)
def test_validate_rejects_shape(name: str, mutate: Callable[[Obs], None], text: str) -> None:
    obs = real(name)
    mutate(obs)

    problems = observation.validate(name, obs, run_plan=plan.REGISTERED)

    assert any(text in p for p in problems), problems


def test_validate_rejects_a_non_object() -> None:
    assert observation.validate("training_1_to_1", [], run_plan=plan.REGISTERED) == [
        "training_1_to_1: expected an object, got list"
    ]
