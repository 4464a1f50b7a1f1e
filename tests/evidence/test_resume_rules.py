"""The resume rules on a real fixture run's observations (tests/data/fixture-artifact): what
the load got and what the resumed steps did, each naming its cause."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from artifact_data import DATA_ARTIFACT

from dcp_invariant import canonical, plan
from dcp_invariant.evidence import diagnosis, observation, provenance, rules, schema

FIXTURE_ARTIFACT = DATA_ARTIFACT.parent / "fixture-artifact"
RUN_PLAN = provenance.recorded_plan(
    canonical.loads((FIXTURE_ARTIFACT / schema.PROVENANCE_FILE).read_bytes())
)


def other(entry: str) -> str:
    """Another value of the same dtype and shape."""
    return entry.split(" ")[0] + " " + "1" * 64


def real(name: str) -> dict[str, Any]:
    return copy.deepcopy(
        canonical.loads((FIXTURE_ARTIFACT / schema.observation_file(name)).read_bytes())
    )


def derive(name: str, obs: dict[str, Any], run_plan: plan.Plan = RUN_PLAN) -> list[str]:
    assert observation.validate(name, obs, run_plan=run_plan) == [], "the edit broke the shape"
    return rules.derive(name, obs, run_plan=run_plan)


@pytest.mark.parametrize("name", ["resume_1", "resume_2"])
def test_a_load_applied_at_the_first_step_is_restored_late(name: str) -> None:
    """Right after the load a key differs from the save, yet every resumed step matches the
    uninterrupted run: nothing was lost, the load was applied late; one reason per rank."""
    obs = real(name)
    key = next(k for k in obs["target"]["ranks"][0]["loaded"] if k.startswith("app.rng"))
    for rank in obs["target"]["ranks"]:
        rank["loaded"][key] = other(rank["loaded"][key])
    reasons = derive(name, obs)
    assert [r.split(": ")[:2] for r in reasons] == [
        [diagnosis.RESTORED_LATE, f"rank {r['rank']}"] for r in obs["target"]["ranks"]
    ], reasons
    assert f"differs from what was saved in {key}, yet every resumed step matches" in reasons[0]
    assert "apply it in load_state_dict() itself" in reasons[0]
    own = RUN_PLAN.checkpointed_by(plan.own_shape())
    assert "right after the app's load()," in derive(name, obs, own)[0]


def test_a_key_lost_at_the_load_that_the_steps_show_is_not_restored_late() -> None:
    """The same key lost, and the first resumed step's state differs too: it did not
    round-trip, whatever the steps did after."""
    obs = real("resume_1")
    rank = obs["target"]["ranks"][0]
    key = next(k for k in rank["loaded"] if k.startswith("app.rng"))
    rank["loaded"][key] = rank["steps"][0]["keys"][key] = other(rank["loaded"][key])
    reasons = derive("resume_1", obs)
    assert reasons and reasons[0].startswith(f"{diagnosis.ROUND_TRIP}: rank 0: {key}"), reasons
    assert not any(r.startswith(diagnosis.RESTORED_LATE) for r in reasons), reasons


def test_an_attribute_the_plan_ignores_is_not_among_what_was_recorded() -> None:
    """--ignore-attr leaves it out of every walk: a record that has it is not this plan's."""
    ignoring = plan.fixture_plan(
        RUN_PLAN.fixture,
        RUN_PLAN.world_sizes,
        RUN_PLAN.steps_before,
        RUN_PLAN.steps_after,
        ignored_attrs=["app.gen"],
    )
    reasons = derive("resume_1", real("resume_1"), ignoring)
    assert reasons == ["plan: reference rank 0 recorded app.gen, which it ignores"], reasons
