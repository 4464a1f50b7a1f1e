"""What a fixture run's loop left running: a warning in the result, never a failed verdict, and
a record the verifier holds to one shape (tests/data/fixture-artifact's observations)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from artifact_data import DATA_ARTIFACT

from dcp_invariant import canonical
from dcp_invariant.evidence import observation, provenance, rules, schema

FIXTURE_ARTIFACT = DATA_ARTIFACT.parent / "fixture-artifact"
RUN_PLAN = provenance.recorded_plan(
    canonical.loads((FIXTURE_ARTIFACT / schema.PROVENANCE_FILE).read_bytes())
)


def real(name: str) -> dict[str, Any]:
    return copy.deepcopy(
        canonical.loads((FIXTURE_ARTIFACT / schema.observation_file(name)).read_bytes())
    )


@pytest.mark.parametrize("name", ["resume_2", "elastic_restart_2_to_2"])
def test_a_leftover_is_a_warning_and_the_verdict_stands(name: str) -> None:
    obs = real(name)
    obs["left_running"] = [
        {"group": "reference", "programs": ["python3", "sleep"]},
        {"group": "torchrun", "programs": ["sleep"]},
    ]
    assert observation.validate(name, obs, run_plan=RUN_PLAN) == []
    result = rules.result_record(name, obs, run_plan=RUN_PLAN)
    assert result["verdict"] == "pass"
    assert result["warnings"] == [
        "reference: left python3, sleep running; killed when it ended",
        "torchrun: left sleep running; killed when it ended",
    ]


def test_a_clean_loop_has_no_warnings() -> None:
    assert rules.result_record("resume_1", real("resume_1"), run_plan=RUN_PLAN)["warnings"] == []


@pytest.mark.parametrize(
    ("left_running", "problem"),
    [
        ([{"group": "b", "programs": ["x"]}, {"group": "a", "programs": ["x"]}], "name order"),
        ([{"group": "a", "programs": ["x"]}, {"group": "a", "programs": ["y"]}], "name order"),
        ([{"group": "a", "programs": ["y", "x"]}], "sorted list"),
        ([{"group": "a", "programs": []}], "non-empty"),
        ([{"group": "a"}], "missing key 'programs'"),
        ("sleep", "expected a list"),
    ],
)
@pytest.mark.parametrize("name", ["resume_1", "elastic_restart_2_to_2"])
def test_a_malformed_record_is_refused(name: str, left_running: Any, problem: str) -> None:
    obs = real(name)
    obs["left_running"] = left_running
    problems = observation.validate(name, obs, run_plan=RUN_PLAN)
    assert any(problem in p and ".left_running" in p for p in problems), problems


@pytest.mark.parametrize("name", ["resume_1", "elastic_restart_2_to_2"])
def test_a_fixture_observation_must_say_what_was_left(name: str) -> None:
    obs = real(name)
    del obs["left_running"]
    assert f"{name}: missing key 'left_running'" in observation.validate(
        name, obs, run_plan=RUN_PLAN
    )
