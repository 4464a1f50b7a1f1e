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
        assert all(observations[name][arm] is None for arm in shared_arms.SHARED), name
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


def test_where_the_home_never_ran_them_a_scenario_keeps_the_arms_it_ran() -> None:
    """resume_1's own first arm failed, so it never ran the shared ones; async_resume_1 ran
    them: they are stored with it and judged, as the runner judged it."""
    observations = stored()
    judged = shared_arms.attached(observations, RUN_PLAN)
    ran = {arm: judged["async_resume_1"][arm] for arm in shared_arms.SHARED}
    observations["resume_1"].update(dict.fromkeys(shared_arms.SHARED))
    observations["async_resume_1"].update(ran)
    kept = shared_arms.recorded_once(observations, RUN_PLAN)
    assert all(kept["async_resume_1"][arm] == ran[arm] for arm in shared_arms.SHARED)
    assert observation.validate("async_resume_1", kept["async_resume_1"], run_plan=RUN_PLAN) == []
    result = rules.results(kept, run_plan=RUN_PLAN)["async_resume_1"]
    assert result["verdict"] == "pass", result["reasons"]


def test_a_job_shares_nothing() -> None:
    """In a torchrun job every scenario runs its own arms, and keeps them."""
    job = plan.in_job_plan("m:f", plan.Launch(nodes=1, nproc_per_node=2, backend="gloo"))
    assert "async_resume_2" in job.names
    assert [n for n in job.names if job.arms_home(n)] == []


def test_without_their_home_the_arms_are_missing_and_the_scenario_says_so() -> None:
    observations = {"async_resume_1": stored()["async_resume_1"]}  # null arms, no resume_1
    judged = shared_arms.attached(observations, RUN_PLAN)["async_resume_1"]
    assert judged["never_saves"] is None
    assert "never_saves: did not run" in rules.derive("async_resume_1", judged, run_plan=RUN_PLAN)


def test_only_a_plan_with_the_home_scenario_shares() -> None:
    alone = plan.fixture_plan("m:f", (1,))
    assert [n for n in alone.names if alone.arms_home(n)] == [
        n for n in alone.names if n.startswith("async_")
    ]
    assert all(alone.arms_home(n) in (None, "resume_1") for n in alone.names)
