"""The async_resume rules on a real fixture run's observations (tests/data/fixture-artifact)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from artifact_data import DATA_ARTIFACT

from dcp_invariant import canonical, plan
from dcp_invariant.evidence import provenance, rules, schema, shared_arms

FIXTURE_ARTIFACT = DATA_ARTIFACT.parent / "fixture-artifact"
RUN_PLAN = provenance.recorded_plan(
    canonical.loads((FIXTURE_ARTIFACT / schema.PROVENANCE_FILE).read_bytes())
)
ASYNC = [n for n in RUN_PLAN.names if n.startswith("async_")]


def observation(name: str) -> dict[str, Any]:
    """``name``'s observation as its rule judges it: with the arms it shares attached from
    the observation that holds them (shared_arms.py)."""
    stored = {
        n: canonical.loads((FIXTURE_ARTIFACT / schema.observation_file(n)).read_bytes())
        for n in {name, RUN_PLAN.arms_home(name) or name}
    }
    return copy.deepcopy(shared_arms.attached(stored, RUN_PLAN)[name])


def test_every_save_mode_is_in_the_checked_in_run() -> None:
    modes = {observation(n)["save_mode"] for n in ASYNC}
    assert modes == {"thread", "staged", "process"}


@pytest.mark.parametrize("name", ASYNC)
def test_the_real_async_runs_pass(name: str) -> None:
    assert rules.derive(name, observation(name), run_plan=RUN_PLAN) == []


@pytest.mark.parametrize("name", ASYNC)
def test_a_failed_background_write_fails_the_scenario_with_its_error(name: str) -> None:
    obs = observation(name)
    obs["reference"]["ranks"][0]["async"]["upload_error"] = "OSError: [Errno 28] disk full"
    reasons = rules.derive(name, obs, run_plan=RUN_PLAN)
    assert (
        "async save (reference) rank 0: the background write failed: OSError: [Errno 28] disk full"
        in reasons
    )


@pytest.mark.parametrize("name", ASYNC)
def test_a_write_that_did_not_overlap_the_next_step_fails(name: str) -> None:
    obs = observation(name)
    obs["reference"]["ranks"][0]["async"]["pending_during_step"] = False
    reasons = rules.derive(name, obs, run_plan=RUN_PLAN)
    assert any("so nothing overlapped it" in r for r in reasons), reasons


def test_a_checkpoint_holding_the_state_after_the_save_names_those_keys() -> None:
    name = ASYNC[0]
    obs = observation(name)
    after = obs["reference"]["ranks"][0]["steps"][0]["keys"]
    loaded = obs["target"]["ranks"][0]["loaded"]
    moved = sorted(k for k in loaded if k.startswith("app.model.") and after.get(k) != loaded[k])
    assert moved, "the step after the save moves the model"
    for key in moved:
        loaded[key] = after[key]  # what a write that read the live tensors late would hold
    reasons = rules.derive(name, obs, run_plan=RUN_PLAN)
    during = [r for r in reasons if r.startswith("changed during the save: rank 0: ")]
    assert during and all(key in during[0] for key in moved[:8]), reasons


# --- an app's own async save: the same observations, as the app's save() would leave them ------

OWN_PLAN = RUN_PLAN.checkpointed_by(plan.own_shape(saves_async=True))
OWN_ASYNC = [n for n in OWN_PLAN.names if n.startswith("async_")]


def own_observation(name: str) -> dict[str, Any]:
    """What the app's own save leaves: no overlap known (the tool cannot hold its writer back),
    no staging."""
    obs = observation(name)
    obs["save_mode"] = "app"
    for rank in obs["reference"]["ranks"]:
        rank["async"] = {"pending_during_step": None, "staged_first": False, "upload_error": None}
    return obs


def test_the_apps_own_async_saves_are_planned_at_each_world_size() -> None:
    assert OWN_ASYNC == ["async_resume_1", "async_resume_2"]
    assert {OWN_PLAN.scenario(n).async_mode for n in OWN_ASYNC} == {"app"}


@pytest.mark.parametrize("name", OWN_ASYNC)
def test_an_apps_async_save_that_holds_the_save_passes(name: str) -> None:
    assert rules.derive(name, own_observation(name), run_plan=OWN_PLAN) == []


def test_an_apps_async_save_claimed_to_overlap_or_mislabelled_fails() -> None:
    """The tool records no overlap for an app's save: a record that has one, or another mode,
    was not made by this plan."""
    obs = own_observation("async_resume_1")
    obs["reference"]["ranks"][0]["async"]["pending_during_step"] = True
    obs["save_mode"] = "thread"
    reasons = rules.derive("async_resume_1", obs, run_plan=OWN_PLAN)
    assert "plan: saved in thread mode, the scenario saves in app" in reasons
    obs["save_mode"] = "app"
    reasons = rules.derive("async_resume_1", obs, run_plan=OWN_PLAN)
    assert reasons == [
        "async save (reference) rank 0: an app's save is not held back, so no overlap is known"
    ]


def test_an_apps_future_that_raised_and_a_late_read_are_named_as_the_apps() -> None:
    obs = own_observation("async_resume_1")
    obs["reference"]["ranks"][0]["async"]["upload_error"] = "OSError"
    after = obs["reference"]["ranks"][0]["steps"][0]["keys"]
    loaded = obs["target"]["ranks"][0]["loaded"]
    for key in [k for k in loaded if k.startswith("app.model.")]:
        loaded[key] = after[key]
    reasons = rules.derive("async_resume_1", obs, run_plan=OWN_PLAN)
    assert "async save (reference) rank 0: the app's save() future raised: OSError" in reasons
    during = [r for r in reasons if r.startswith("changed during the save: rank 0: ")]
    assert len(during) == 1 and "the app's save() returned before it had copied them" in during[0]
