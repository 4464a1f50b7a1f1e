"""The scenario plan: one home for what each scenario does, and registries that agree with it."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from dcp_invariant import dcp_layout, errors, plan
from dcp_invariant.evidence.families import FAMILIES
from dcp_invariant.suite.scenarios import DRIVERS


def test_driver_shape_and_rule_registries_cover_exactly_the_planned_families() -> None:
    families = set(plan.FAMILIES)
    assert set(DRIVERS) == families
    assert set(FAMILIES) == families
    dcp = plan.fixture_plan("m:f", (1, 2), resume_with_torch=["2.15.0"], torch_release="2.13.0")
    own = dcp.checkpointed_by(plan.own_shape())
    fixture_families = {s.family for p in (dcp, own) for s in p.scenarios}
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
        assert scenario.damage.target_suffix in (dcp_layout.METADATA_FILE, dcp_layout.SHARD_SUFFIX)
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
    assert [
        dcp_layout.expected_shard_rows(rows, world_size, r) for r in range(world_size)
    ] == expected


def test_a_fixture_plan_derives_resumes_reshards_and_the_restart() -> None:
    the_plan = plan.fixture_plan("pkg.mod:make_app", (2, 1, 4), 5, 2)
    assert the_plan.world_sizes == (1, 2, 4)
    assert the_plan.names == (
        "resume_1",
        "resume_2",
        "resume_4",
        "reshard_1_to_2",
        "reshard_1_to_4",
        "reshard_2_to_1",
        "reshard_2_to_4",
        "reshard_4_to_1",
        "reshard_4_to_2",
        "async_resume_1",
        "async_resume_2",
        "async_resume_4",
        "async_staged_resume_4",
        "async_process_resume_1",
        "elastic_restart_2_to_2",
    )
    assert plan.fixture_plan("m:f", (1, 4)).names[-1] == "async_process_resume_1"  # no torchrun
    assert plan.plan_from_record(the_plan.to_record()) == the_plan


def test_an_app_that_saves_itself_is_resumed_at_each_world_size_and_across_the_restart() -> None:
    """What the app's framework writes is its own: unless it declares more, the tool neither
    reshards it nor makes its save asynchronous. The record names the checkpointing only then,
    so a DCP run's evidence reads as before."""
    dcp = plan.fixture_plan("m:f", (1, 2, 4), 5, 2)
    own = dcp.checkpointed_by(plan.own_shape())
    assert own.names == (
        "resume_1",
        "resume_2",
        "resume_4",
        "elastic_restart_2_to_2",
        "half_written_4",
    )
    assert own.scenario("resume_2").summary == (
        "5+2 steps on 2 rank(s); fresh ranks load step 5 with the app's own load() and match "
        "the last 2"
    )
    assert own.checkpointed_by(plan.DCP_SHAPE) == dcp and dcp.checkpointed_by(plan.DCP_SHAPE) is dcp
    assert "checkpointing" not in dcp.to_record()
    assert own.to_record()["checkpointing"] == "app"
    assert not {"reshards", "saves_async", "compares_state"} & set(own.to_record())
    assert plan.plan_from_record(own.to_record()) == own
    assert plan.fixture_plan("m:f", (1, 4), shape=plan.own_shape()).names == (
        "resume_1",
        "resume_4",
        "half_written_4",
    )
    assert dcp.notes == ()
    assert own.notes == (
        "m:f's app has its own save() and load(): the tool ran them instead of DCP, at each "
        "world size and across torchrun's restart; no reshard checked: set reshards = True on "
        "the app if its load() restores a save made at another world size; no async save "
        "checked: set saves_async = True on the app if its save() returns a future that "
        "completes with the write",
    )


def test_an_app_that_declares_it_reshards_and_saves_async_gets_those_scenarios() -> None:
    """Each declaration adds the scenarios that check it, recorded so that the verifier derives
    the same plan; the note says what was declared."""
    both = plan.fixture_plan(
        "m:f", (1, 2), 3, 2, shape=plan.own_shape(reshards=True, saves_async=True)
    )
    assert both.names == (
        "resume_1",
        "resume_2",
        "reshard_1_to_2",
        "reshard_2_to_1",
        "async_resume_1",
        "async_resume_2",
        "elastic_restart_2_to_2",
        "half_written_2",
    )
    assert {s.checkpointing for s in both.scenarios} == {"app"}
    assert both.scenario("async_resume_2").async_mode == "app"
    assert both.scenario("reshard_1_to_2").summary == (
        "saved at step 3 on 1 rank(s) by the app's save(), loaded on 2 by its load(): every key "
        "bit-identical"
    )
    record = both.to_record()
    assert (record["reshards"], record["saves_async"]) == (True, True)
    assert plan.plan_from_record(record) == both
    assert both.notes[0].endswith(
        "; resharded between world sizes, as it declares (reshards = True); its save() left "
        "running through the next step, as it declares (saves_async = True)"
    )
    only_async = plan.fixture_plan("m:f", (2,), shape=plan.own_shape(saves_async=True))
    assert only_async.names == (
        "resume_2",
        "async_resume_2",
        "elastic_restart_2_to_2",
        "half_written_2",
    )
    # Rank-local components mean something once the app is loaded at another world size.
    local = plan.fixture_plan(
        "m:f", (1, 2), rank_local=["data"], shape=plan.own_shape(reshards=True)
    )
    assert local.rank_local == ("data",)
    with pytest.raises(errors.PlanError, match="declares reshards = True but has no state_dict"):
        plan.fixture_plan("m:f", (1, 2), shape=plan.own_shape(has_state=False, reshards=True))


@pytest.mark.parametrize("key", ["checkpointing", "compares_state", "reshards", "saves_async"])
def test_a_recorded_declaration_other_than_its_one_value_is_refused(key: str) -> None:
    record = plan.fixture_plan("m:f", (1, 2)).to_record()
    record[key] = {"checkpointing": "dcp", "compares_state": True}.get(key, False)
    with pytest.raises(errors.PlanError, match=f"plan: {key} .*, expected .* or no key"):
        plan.plan_from_record(record)


def test_an_app_without_state_is_judged_by_its_losses_and_says_so() -> None:
    losses_only = plan.fixture_plan("m:f", (1, 2)).checkpointed_by(plan.own_shape(has_state=False))
    assert losses_only.names == ("resume_1", "resume_2", "elastic_restart_2_to_2", "half_written_2")
    assert losses_only.to_record()["compares_state"] is False
    assert plan.plan_from_record(losses_only.to_record()) == losses_only
    assert losses_only.notes[-1].startswith("m:f's app has no state_dict(): each resume is judged")
    with pytest.raises(errors.PlanError, match="only an app that saves itself may have no state"):
        plan.fixture_plan("m:f", (1,), shape={**plan.DCP_SHAPE, "has_state": False})


def test_an_app_that_saves_itself_in_a_job_resumes_through_torchruns_restart() -> None:
    launch = plan.Launch(2, 2, "gloo")
    dcp = plan.in_job_plan("m:f", launch)
    own = dcp.checkpointed_by(plan.own_shape(has_state=False))
    assert own.kind == "in_job" and own.names == ("resume_4",)
    assert own.to_record()["checkpointing"] == "app"
    assert plan.plan_from_record(own.to_record()) == own
    second = plan.in_job_plan("m:f", plan.Launch(1, 4, "gloo", resumed_from=2))
    with pytest.raises(errors.PlanError, match="--resume-from: this app saves itself and does not"):
        second.checkpointed_by(plan.own_shape())
    declared = dcp.checkpointed_by(plan.own_shape(saves_async=True))
    assert declared.names == ("resume_4", "async_resume_4")
    assert declared.scenario("async_resume_4").async_mode == "app"
    resharded = second.checkpointed_by(plan.own_shape(reshards=True))
    assert resharded.names == ("reshard_2_to_4",)
    assert resharded.scenario("reshard_2_to_4").checkpointing == "app"
    assert plan.plan_from_record(resharded.to_record()) == resharded


def test_ignored_attributes_are_recorded_only_when_given_and_kept_by_every_shape() -> None:
    plain = plan.fixture_plan("m:f", (1, 2))
    assert "ignored_attrs" not in plain.to_record()
    ignoring = plan.fixture_plan("m:f", (1, 2), ignored_attrs=["rng.numpy", "app.ema"])
    assert ignoring.ignored_attrs == ("app.ema", "rng.numpy")
    assert plan.plan_from_record(ignoring.to_record()) == ignoring
    own = ignoring.checkpointed_by(plan.own_shape())
    assert own.ignored_attrs == ignoring.ignored_attrs
    assert plan.plan_from_record(own.to_record()) == own
    job = plan.in_job_plan("m:f", plan.Launch(1, 2, "gloo"), ignored_attrs=["app.ema"])
    assert plan.plan_from_record(job.to_record()) == job
    for bad in ([], ["app.ema", "app.a"], ["ema"]):
        record = {**ignoring.to_record(), "ignored_attrs": bad}
        with pytest.raises(errors.PlanError, match=r"ignored_attrs|--ignore-attr"):
            plan.plan_from_record(record)


def test_rank_local_components_of_an_app_that_does_not_reshard_are_refused() -> None:
    with pytest.raises(errors.PlanError, match=r"--rank-local data: this app saves itself"):
        plan.fixture_plan("m:f", (1, 2), rank_local=["data"]).checkpointed_by(plan.own_shape())


def test_the_shapes_of_two_apps_are_told_apart_in_words() -> None:
    assert plan.described(plan.DCP_SHAPE) == "saved by the tool through DCP"
    assert plan.described(plan.own_shape(has_state=False, saves_async=True)) == (
        "saving itself, with no state_dict(), reshards = False, saves_async = True"
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("module_only", (1,)), "is not MODULE:CALLABLE"),
        (("a b:c", (1,)), "is not MODULE:CALLABLE"),
        (("m:f", ()), "world sizes []"),
        (("m:f", (0,)), "distinct integers from 1 to 8"),
        (("m:f", (9,)), "distinct integers from 1 to 8"),
        (("m:f", (2, 2)), "distinct integers"),
        (("m:f", (1,), 0), "steps before the save: 0"),
        (("m:f", (1,), 3, 1001), "steps after: 1001"),
        (("m:f", (1,), True), "steps before the save: True"),
        (("m:f", (1,), 3, 3, {"rank": 1}), "the tool passes rank and world_size itself"),
        (("m:f", (1,), 3, 3, {"not valid": 1}), "must be a Python identifier"),
        (("m:f", (1,), 3, 3, {"class": 1}), "must be a Python identifier"),
        (("m:f", (1,), 3, 3, {"w": float("nan")}), "the value must be JSON"),
        (("m:f", (1,), 3, 3, {"w": (1, 2)}), "the value must be JSON"),
        (("m:f", (1,), 3, 3, {"w": "x" * 5000}), "more than 4096 bytes"),
        (("m:f", (1,), 3, 3, None, ["app.data"]), "--rank-local 'app.data'"),
        (("m:f", (1,), 3, 3, None, [""]), "--rank-local ''"),
        (("m:f", (1,), 3, 3, None, ["data", "data"]), "each component once"),
    ],
)
def test_a_plan_outside_the_grammar_is_refused(arguments: tuple[Any, ...], message: str) -> None:
    with pytest.raises(errors.PlanError, match=re.escape(message)):
        plan.fixture_plan(*arguments)


def test_fixture_arguments_and_rank_local_components_are_recorded_and_read_back() -> None:
    the_plan = plan.fixture_plan(
        "m:f", (1, 2), fixture_args={"width": 64, "name": "tiny"}, rank_local=["loader", "data"]
    )
    record = the_plan.to_record()
    assert record["fixture_args"] == {"name": "tiny", "width": 64}
    assert record["rank_local"] == ["data", "loader"]
    assert plan.plan_from_record(record) == the_plan
    assert the_plan.arguments == {"name": "tiny", "width": 64}


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda r: r.update(kind="registered"), "kind 'registered'"),
        (lambda r: r.update(world_sizes=[2, 1]), "sorted list"),
        (lambda r: r.update(scenarios=["resume_1"]), "are not the ones its parameters give"),
        (lambda r: r.pop("steps_after"), "expected exactly the keys"),
        (lambda r: r.update(extra=1), "expected exactly the keys"),
        (lambda r: r.update(steps_before=-1), "steps before the save: -1"),
        (lambda r: r.update(rank_local=["b", "a"]), "rank_local must be a sorted list"),
        (lambda r: r.update(fixture_args=[1]), "fixture_args must be an object"),
        (lambda r: r.update(fixture_args={"rank": 0}), "passes rank and world_size itself"),
        (lambda r: r.update(checkpointing="dcp"), "checkpointing 'dcp', expected 'app' or no"),
        (lambda r: r.update(checkpointing="app"), "are not the ones its parameters give"),
        (lambda r: r.update(checkpointing="app", reshards=True), "are not the ones its param"),
        (lambda r: r.update(compares_state=True), "compares_state True, expected False or no"),
        (lambda r: r.update(compares_state=False), "only an app that saves itself may have no"),
    ],
)
def test_a_recorded_plan_is_held_to_the_grammar_and_to_its_scenarios(
    edit: Callable[[dict[str, Any]], object], message: str
) -> None:
    record = plan.fixture_plan("m:f", (1, 2)).to_record()
    edit(record)
    with pytest.raises(errors.PlanError, match=re.escape(message)):
        plan.plan_from_record(record)


@pytest.mark.parametrize(
    ("given", "installed", "says"),
    [
        (["2.15"], "2.13.0", "--resume-with-torch '2.15': not a registered release; give one of"),
        (["2.15.0", "2.15.0"], "2.13.0", "--resume-with-torch 2.15.0: given twice"),
        (["2.13.0"], "2.13.0", "--resume-with-torch 2.13.0: that is the installed torch"),
        # No torch installed (or an unregistered one): said after the releases were checked.
        (["2.15"], "", "--resume-with-torch '2.15': not a registered release"),
        (["2.15.0"], "", "the installed torch is not a registered release (or none is installed)"),
    ],
)
def test_resume_with_torch_takes_registered_releases_other_than_the_installed_one(
    given: list[str], installed: str, says: str
) -> None:
    with pytest.raises(errors.PlanError, match=re.escape(says)):
        plan.fixture_plan("m:f", resume_with_torch=given, torch_release=installed)


def test_cross_release_scenarios_are_named_by_direction_and_recorded_with_both_releases() -> None:
    the_plan = plan.fixture_plan(
        "m:f", (1, 2), resume_with_torch=["2.15.0", "2.11.0"], torch_release="2.13.0"
    )
    across = [s for s in the_plan.scenarios if s.family == "cross_release"]
    assert [(s.name, s.loading_release) for s in across] == [
        ("downgrade_2.13.0_to_2.11.0_1", "2.11.0"),
        ("downgrade_2.13.0_to_2.11.0_2", "2.11.0"),
        ("upgrade_2.13.0_to_2.15.0_1", "2.15.0"),
        ("upgrade_2.13.0_to_2.15.0_2", "2.15.0"),
    ]
    record = the_plan.to_record()
    assert (record["resume_with_torch"], record["torch_release"]) == (
        ["2.11.0", "2.15.0"],
        "2.13.0",
    )
    assert plan.plan_from_record(record) == the_plan
    assert "resume_with_torch" not in plan.fixture_plan("m:f").to_record()
    with pytest.raises(errors.PlanError, match="sorted oldest first"):
        plan.plan_from_record({**record, "resume_with_torch": ["2.15.0", "2.11.0"]})


def test_an_app_without_a_state_dict_is_not_resumed_on_another_release() -> None:
    """Its resumes on the other release are held only to each other: a load() there that
    restores nothing would pass, so the plan refuses it, naming the fix; with a state_dict()
    the same app gets its cross-release scenarios."""
    dcp = plan.fixture_plan("m:f", (1, 2), resume_with_torch=["2.15.0"], torch_release="2.13.0")
    with pytest.raises(errors.PlanError) as caught:
        dcp.checkpointed_by(plan.own_shape(has_state=False))
    said = str(caught.value)
    assert said.startswith("--resume-with-torch 2.15.0: m:f's app saves itself and has no"), said
    assert "give the app a state_dict(), or drop --resume-with-torch" in said
    own = dcp.checkpointed_by(plan.own_shape())
    assert [s.name for s in own.scenarios if s.family == "cross_release"] == [
        "upgrade_2.13.0_to_2.15.0_1",
        "upgrade_2.13.0_to_2.15.0_2",
    ]
