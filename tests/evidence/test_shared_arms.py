"""The arms a fixture run's scenarios share, recorded once (evidence/shared_arms.py), on the
checked-in fixture run."""

from __future__ import annotations

from typing import Any

from artifact_data import DATA_ARTIFACT

from dcp_invariant import canonical, plan
from dcp_invariant.evidence import observation, provenance, rules, schema, shared_arms

FIXTURE_ARTIFACT = DATA_ARTIFACT.parent / "fixture-artifact"
RUN_PLAN = provenance.recorded_plan(
    canonical.loads((FIXTURE_ARTIFACT / schema.PROVENANCE_FILE).read_bytes())
)


def stored() -> dict[str, dict[str, Any]]:
    return {
        n: canonical.loads((FIXTURE_ARTIFACT / schema.observation_file(n)).read_bytes())
        for n in RUN_PLAN.names
    }


def test_each_async_scenario_keeps_its_shared_arms_in_its_sizes_resume() -> None:
    assert shared_arms.sharing(RUN_PLAN) == [
        "async_resume_1",
        "async_resume_2",
        "async_staged_resume_2",
        "async_process_resume_1",
    ]
    observations = stored()
    for name in shared_arms.sharing(RUN_PLAN):
        assert not set(shared_arms.SHARED) & set(observations[name]), name
        home = RUN_PLAN.arms_home(name)
        assert home == f"resume_{RUN_PLAN.scenario(name).source_world_size}"
        judged = shared_arms.attached(observations, RUN_PLAN)[name]
        assert all(judged[arm] == observations[home][arm] for arm in shared_arms.SHARED)
    # The others are judged as stored.
    assert shared_arms.attached(observations, RUN_PLAN)["resume_1"] is observations["resume_1"]


def test_an_edit_of_a_shared_arm_fails_every_scenario_that_shares_it() -> None:
    """One record, so one edit: resume_1 and each async scenario at 1 fail on it."""
    observations = stored()
    rank = observations["resume_1"]["never_saves"]["ranks"][0]
    rank["losses_after"][1] = float.hex(float.fromhex(rank["losses_after"][1]) * 2)
    failed = {
        name
        for name, result in rules.results(observations, run_plan=RUN_PLAN).items()
        if result["verdict"] == "fail"
    }
    assert failed == {"resume_1", "async_resume_1", "async_process_resume_1"}


def test_an_async_observation_holding_the_arms_itself_is_refused() -> None:
    """The artifact holds them once: a copy in a sharing scenario's file is not its shape."""
    observations = stored()
    name = "async_resume_2"
    copied = {**observations[name], "repeat": observations["resume_2"]["repeat"]}
    assert observation.validate(name, copied, run_plan=RUN_PLAN) != []


def test_without_their_home_the_arms_are_missing_and_the_scenario_says_so() -> None:
    observations = {"async_resume_1": stored()["async_resume_1"]}
    judged = shared_arms.attached(observations, RUN_PLAN)["async_resume_1"]
    assert judged["never_saves"] is None
    assert "never_saves: did not run" in rules.derive("async_resume_1", judged, run_plan=RUN_PLAN)


def test_only_a_plan_with_the_home_scenario_shares() -> None:
    alone = plan.fixture_plan("m:f", (1,))
    assert [n for n in alone.names if alone.arms_home(n)] == [
        n for n in alone.names if n.startswith("async_")
    ]
    assert all(alone.arms_home(n) in (None, "resume_1") for n in alone.names)
