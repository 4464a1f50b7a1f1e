"""The scenario plan: one home for what each scenario does, and registries that agree with it."""

from __future__ import annotations

import pytest

from dcp_invariant import plan
from dcp_invariant.evidence import observation, rules
from dcp_invariant.suite.scenarios import DRIVERS


def test_driver_shape_and_rule_registries_cover_exactly_the_planned_families() -> None:
    families = set(plan.FAMILIES)
    assert set(DRIVERS) == families
    assert set(observation.FAMILY_SHAPES) == families
    assert set(rules.FAMILY_RULES) == families
    fixture_families = {s.family for s in plan.fixture_plan("m:f", (1, 2)).scenarios}
    assert {s.family for s in plan.SCENARIOS} | fixture_families == families


def test_scenario_names_are_unique_and_world_sizes_positive() -> None:
    assert len(set(plan.SCENARIO_NAMES)) == len(plan.SCENARIOS)
    for scenario in plan.SCENARIOS:
        assert scenario.source_world_size >= 1 and scenario.target_world_size >= 1
        assert (scenario.damage is not None) == (scenario.family == "damaged"), scenario.name


def test_damage_plans_name_a_dcp_file_and_a_receipt_reason() -> None:
    for scenario in plan.SCENARIOS:
        if scenario.damage is None:
            continue
        assert scenario.damage.target_suffix in (plan.METADATA_FILE, plan.SHARD_SUFFIX)
        assert scenario.damage.refusal in plan.FAILURE_REASONS
        # A removed file is reported missing; a flipped byte keeps the size, so its digest fails.
        expected = "missing" if scenario.damage.kind == "remove" else "digest"
        assert scenario.damage.refusal == expected, scenario.name


def test_torchrun_arguments_start_with_the_elastic_job_and_name_the_rank_module() -> None:
    head = plan.TORCHRUN_ARGUMENTS[: len(plan.ELASTIC_ARGUMENTS)]
    assert head == plan.ELASTIC_ARGUMENTS
    assert plan.TORCHRUN_ARGUMENTS[-3:] == (
        "--module",
        plan.ELASTIC_RANK_MODULE,
        plan.ELASTIC_PAYLOAD_FILE,
    )
    assert "--nproc-per-node=2" in plan.ELASTIC_ARGUMENTS
    assert plan.DYING_RANK < 2


@pytest.mark.parametrize(
    ("rows", "world_size", "expected"),
    [(7, 2, [4, 3]), (5, 4, [2, 2, 1, 0]), (0, 2, [0, 0])],
)
def test_shard_rows_follow_torch_chunk(rows: int, world_size: int, expected: list[int]) -> None:
    assert [plan.expected_shard_rows(rows, world_size, r) for r in range(world_size)] == expected
