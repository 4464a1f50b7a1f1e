"""The reshard rules on a real fixture run's observations (tests/data/fixture-artifact): a load
that fails at the target world size is named by cause, saved state that no target rank loaded
fails the scenario, and components declared rank-local are left out as the plan says."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
from artifact_data import DATA_ARTIFACT

from dcp_invariant import canonical, plan
from dcp_invariant.evidence import diagnosis, observation, provenance, rules, schema
from dcp_invariant.evidence.families import reshard_evidence

FIXTURE_ARTIFACT = DATA_ARTIFACT.parent / "fixture-artifact"
RUN_PLAN = provenance.recorded_plan(
    canonical.loads((FIXTURE_ARTIFACT / schema.PROVENANCE_FILE).read_bytes())
)
GROW, SHRINK = "reshard_1_to_2", "reshard_2_to_1"
ENTRY = "int64[] " + "1" * 64


def real(name: str) -> dict[str, Any]:
    return copy.deepcopy(
        canonical.loads((FIXTURE_ARTIFACT / schema.observation_file(name)).read_bytes())
    )


def derive(name: str, obs: dict[str, Any], run_plan: Any = RUN_PLAN) -> list[str]:
    assert observation.validate(name, obs, run_plan=run_plan) == [], "the edit broke the shape"
    return rules.derive(name, obs, run_plan=run_plan)


def with_rank_keys(obs: dict[str, Any]) -> None:
    """Each source rank saved a position under its own key, and each target rank holds its own."""
    for rank in obs["source"]["ranks"]:
        rank["saved"][f"app.loader.rank_{rank['rank']}"] = ENTRY
    for rank in obs["target"]["ranks"]:
        rank["loaded"][f"app.loader.rank_{rank['rank']}"] = ENTRY


def failed_load(obs: dict[str, Any], failures: dict[int, dict[str, Any]]) -> None:
    """DCP refused the load on every target rank; ``failures`` are the ranks' own reasons."""
    for rank in obs["target"]["ranks"]:
        rank.update(loaded=None, steps=[], diffs=[])
        rank["load_error"] = failures.get(
            rank["rank"], {"kind": "another rank", "key": None, "exception": None}
        )


@pytest.mark.parametrize("name", [GROW, SHRINK])
def test_the_real_reshards_pass_and_leave_nothing_out(name: str) -> None:
    obs = real(name)
    assert obs["left_out"] == []
    assert derive(name, obs) == []


def test_a_missing_key_when_growing_is_named_with_the_flag_that_fixes_it() -> None:
    obs = real(GROW)
    failed_load(
        obs, {1: {"kind": "missing key", "key": "app.loader.rank_1.pos", "exception": None}}
    )

    reasons = derive(GROW, obs)

    assert reasons == [
        "does not reshard: rank 1 at world size 2: the checkpoint saved at world size 1 has no "
        "app.loader.rank_1.pos: state keyed by rank does not reshard (torchtitan issue #811); "
        "make it a DTensor, or declare its component rank-local (--rank-local loader)"
    ]


def test_a_size_mismatch_and_an_unknown_failure_are_named_too() -> None:
    obs = real(GROW)
    failed_load(
        obs,
        {
            0: {"kind": "size mismatch", "key": "app.model.0.weight", "exception": None},
            1: {"kind": "error", "key": None, "exception": "ValueError"},
        },
    )

    reasons = derive(GROW, obs)

    assert len(reasons) == 2, reasons
    assert reasons[0].startswith(
        "does not reshard: rank 0 at world size 2: app.model.0.weight was saved with another size"
    )
    assert reasons[1] == (
        "does not reshard: rank 1 at world size 2: DCP's load raised ValueError; its traceback is "
        "in the worker's log"
    )


def test_a_failed_load_where_every_rank_blames_another_still_fails() -> None:
    obs = real(GROW)
    failed_load(obs, {})

    assert derive(GROW, obs) == [
        "does not reshard: the load failed on ranks 0, 1, each blaming another"
    ]


def test_a_failed_load_at_one_world_size_is_a_round_trip_failure() -> None:
    obs = real("resume_2")
    failed_load(obs, {0: {"kind": "missing key", "key": "app.extra", "exception": None}})

    reasons = derive("resume_2", obs)

    assert reasons == [
        f"{diagnosis.ROUND_TRIP}: resumed rank 0: the checkpoint saved at world size 2 has no "
        "app.extra; state_dict() names it at the load, not at the save"
    ]


def test_saved_state_no_target_rank_loaded_fails_naming_each_key() -> None:
    # Saved at 2 with a key per rank, loaded at 1: rank 1's position is silently dropped.
    obs = real(SHRINK)
    with_rank_keys(obs)

    reasons = derive(SHRINK, obs)

    assert reasons == [
        "saved state not loaded: saved at world size 2, loaded by no rank at 1: "
        "app.loader.rank_1; their values are dropped, as a loader keyed by rank loses its "
        "positions (torchtitan issue #811): make the state a DTensor, or, if each rank may "
        "start it afresh when the world size changes, declare it --rank-local loader"
    ]


def test_a_component_declared_rank_local_is_left_out_as_the_plan_says() -> None:
    the_plan = dataclasses.replace(RUN_PLAN, rank_local=("loader",))
    obs = real(SHRINK)
    with_rank_keys(obs)
    obs["left_out"] = ["loader"]

    assert derive(SHRINK, obs, the_plan) == []
    assert rules.result_record(SHRINK, obs, run_plan=the_plan)["left_out"] == ["loader"]
    # The same observation judged by a plan that declares nothing: it left out what it may not.
    assert derive(SHRINK, obs) == [
        "plan: the reshard left out ['loader'], the plan's rank-local components are []"
    ]


def test_a_rank_local_component_is_still_compared_by_a_reshard_that_did_not_leave_it_out() -> None:
    the_plan = dataclasses.replace(RUN_PLAN, rank_local=("loader",))
    obs = real(SHRINK)
    with_rank_keys(obs)  # left_out stays []: the plan says ["loader"]

    reasons = derive(SHRINK, obs, the_plan)

    assert reasons[0] == (
        "plan: the reshard left out [], the plan's rank-local components are ['loader']"
    )


def test_ranks_that_disagree_on_the_loss_after_a_reshard_are_not_a_failure() -> None:
    # A rank's loss may be its own (its own data): only the losses' finiteness is judged.
    obs = real(GROW)
    obs["target"]["ranks"][1]["steps"][0]["loss"] = "0x1.0000000000000p-1"

    assert derive(GROW, obs) == []


def _ranks(losses: list[list[str]], key: str) -> list[dict[str, Any]]:
    if key == "losses_before":
        return [{"rank": r, "losses_before": ls} for r, ls in enumerate(losses)]
    return [
        {"rank": r, "load_error": None, "loaded": {"k": ENTRY}, "steps": [{"loss": x} for x in ls]}
        for r, ls in enumerate(losses)
    ]


ONE, TWO = "0x1.0000000000000p-1", "0x1.8000000000000p-1"


def test_a_global_loss_before_the_save_must_stay_global_after_the_reshard() -> None:
    source = _ranks([[ONE, TWO], [ONE, TWO]], "losses_before")
    agreeing = _ranks([[ONE, TWO]] * 4, "steps")
    drifting = _ranks([[ONE, TWO], [ONE, TWO], [ONE, ONE], [ONE, TWO]], "steps")

    assert reshard_evidence.disagreement(source, agreeing, 2) == []
    [reason] = reshard_evidence.disagreement(source, drifting, 2)
    assert reason.startswith(f"{diagnosis.OUTSIDE_STATE_DICT}: the 2 ranks reported one loss")
    assert "resumed step 2" in reason and "rank 2: 0.5" in reason


def test_per_rank_losses_before_the_save_ask_nothing_of_the_ranks_after_it() -> None:
    own = _ranks([[ONE, ONE], [TWO, TWO]], "losses_before")
    drifting = _ranks([[ONE], [TWO]], "steps")

    assert reshard_evidence.disagreement(own, drifting, 2) == []
    # One source rank shows nothing about the loop: its loss is "global" trivially.
    assert reshard_evidence.disagreement(own[:1], drifting, 1) == []


OWN_PLAN = RUN_PLAN.checkpointed_by(plan.own_shape(reshards=True))


def test_an_apps_own_reshard_is_judged_by_its_declaration() -> None:
    """The same saves, loaded by an app that declares it reshards: equal keys pass; a load()
    that raises at the new world size breaks the declaration, named with the fix."""
    assert derive(GROW, real(GROW), OWN_PLAN) == []
    obs = real(GROW)
    failed_load(obs, {})
    for rank in obs["target"]["ranks"]:
        rank["load_error"] = {"kind": "app load", "key": None, "exception": "FileNotFoundError"}
    reasons = derive(GROW, obs, OWN_PLAN)
    assert reasons[0] == (
        "does not reshard: rank 0 at world size 2: the app's own load() raised "
        "FileNotFoundError on the checkpoint its save() wrote at world size 1, though the app "
        "declares reshards = True: make its load() take a save from another world size, or "
        "drop the declaration; its traceback is in the worker's log"
    )
    assert not any("DTensor" in r for r in reasons), reasons


@pytest.mark.parametrize("by_app", [False, True])
def test_a_load_error_the_plans_loader_cannot_give_is_not_taken_at_its_word(by_app: bool) -> None:
    """DCP never raises an app's load() error, nor an app's load() DCP's missing key: such a
    record was not made by this plan, and the scenario fails instead of naming a cause."""
    obs = real(GROW)
    kind = "missing key" if by_app else "app load"
    failed_load(obs, {1: {"kind": kind, "key": "app.model.0.weight", "exception": "KeyError"}})
    reasons = derive(GROW, obs, OWN_PLAN if by_app else RUN_PLAN)
    whose = "the app's own load()" if by_app else "DCP's load"
    assert (
        f"rank 1 at world size 2: a load error of kind {kind!r}, which {whose} cannot give: the "
        "record is not this plan's"
    ) in reasons, reasons


def test_a_non_finite_loss_in_the_resharded_steps_names_the_rank_and_world_size() -> None:
    """The resharded rank records the NaN and stops there (ranks/fixture_tasks.py)."""
    obs = real(GROW)
    rank = obs["target"]["ranks"][1]
    rank["steps"] = [*rank["steps"][:1], {**rank["steps"][1], "loss": "nan"}]
    n = obs["steps_before_save"]
    assert derive(GROW, obs) == [
        f"non-finite loss: rank 1 at world size 2: step {n + 2} returned nan, so nothing after "
        "it can be compared; find what overflows or divides by zero (the learning rate, the "
        "data, a loss scale), or check fewer steps (--steps-before, --steps-after)"
    ]
