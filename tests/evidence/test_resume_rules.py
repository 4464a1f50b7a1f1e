"""The resume rules on a real fixture run's observations (tests/data/fixture-artifact): what
the load got and what the resumed steps did, each naming its cause."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from artifact_data import DATA_ARTIFACT
from forge import reaggregate

from dcp_invariant import canonical, plan
from dcp_invariant.evidence import diagnosis, observation, provenance, rules, schema, shared_arms

FIXTURE_ARTIFACT = DATA_ARTIFACT.parent / "fixture-artifact"
RUN_PLAN = provenance.recorded_plan(
    canonical.loads((FIXTURE_ARTIFACT / schema.PROVENANCE_FILE).read_bytes())
)


def other(entry: str) -> str:
    """Another value of the same dtype and shape."""
    return entry.split(" ")[0] + " " + "1" * 64


def real(name: str) -> dict[str, Any]:
    """``name``'s observation as its rule judges it: with the arms it shares attached from
    the observation that holds them (shared_arms.py)."""
    stored = {
        n: canonical.loads((FIXTURE_ARTIFACT / schema.observation_file(n)).read_bytes())
        for n in {name, RUN_PLAN.arms_home(name) or name}
    }
    return copy.deepcopy(shared_arms.attached(stored, RUN_PLAN)[name])


def derive(name: str, obs: dict[str, Any], run_plan: plan.Plan = RUN_PLAN) -> list[str]:
    stored = shared_arms.recorded_once({name: obs}, run_plan)[name]  # as the artifact holds it
    assert observation.validate(name, stored, run_plan=run_plan) == [], "the edit broke the shape"
    return rules.derive(name, obs, run_plan=run_plan)


def judge(
    name: str, obs: dict[str, Any], run_plan: plan.Plan = RUN_PLAN
) -> tuple[list[str], list[str]]:
    """The reasons and the cautions (warnings) of ``obs``, checked as :func:`derive` does."""
    derive(name, obs, run_plan)
    return rules.judge(name, obs, run_plan=run_plan)


@pytest.mark.parametrize("name", ["resume_1", "resume_2"])
def test_a_load_applied_at_the_first_step_passes_restored_late_with_a_warning(name: str) -> None:
    """Right after the load a key differs from the save, yet every resumed step matches the
    uninterrupted run: nothing was lost, the load was applied late (Hugging Face's Trainer
    restores its RNG just before the first step). It passes, with one warning per rank that
    names the key and the hazard."""
    obs = real(name)
    key = next(k for k in obs["target"]["ranks"][0]["loaded"] if k.startswith("app.rng"))
    for rank in obs["target"]["ranks"]:
        rank["loaded"][key] = other(rank["loaded"][key])
    reasons, cautions = judge(name, obs)
    assert reasons == []
    assert [c.split(": ")[:2] for c in cautions] == [
        [diagnosis.RESTORED_LATE, f"rank {r['rank']}"] for r in obs["target"]["ranks"]
    ], cautions
    assert f"differs from what was saved in {key}, yet every resumed step matches" in cautions[0]
    assert "a checkpoint taken between the load and that step" in cautions[0]
    assert "apply it in load_state_dict() itself" in cautions[0]
    record = rules.result_record(name, obs, run_plan=RUN_PLAN)
    assert (record["verdict"], record["warnings"]) == ("pass", cautions)
    own = RUN_PLAN.checkpointed_by(plan.own_shape())
    assert "right after the app's load()," in judge(name, obs, own)[1][0]


def _rank_0_saved(obs: dict[str, Any], key: str, value: str) -> None:
    """Rank 0 saved ``value`` under ``key`` (in both runs that save), and loads it back."""
    for arm in ("reference", "repeat"):
        next(r for r in obs[arm]["ranks"] if r["rank"] == 0)["saved"][key] = value
    next(r for r in obs["target"]["ranks"] if r["rank"] == 0)["loaded"][key] = value


def _model_keys(obs: dict[str, Any]) -> list[str]:
    return [k for k in obs["target"]["ranks"][0]["loaded"] if k.startswith("app.model.")]


def test_rank_0s_copy_that_the_first_step_overwrites_passes() -> None:
    """A value that differs by rank at the save (DDP's BatchNorm buffers) and rank 0's copy
    kept (Fabric saves rank 0's state alone; DCP keeps one copy): rank 1 resumes rank 0's, its
    steps all match, since DDP's forward broadcasts rank 0's buffers. Nothing was lost, and a
    checkpoint taken right after the load holds the same copy: no reason."""
    obs = real("resume_2")
    key = _model_keys(obs)[0]
    rank_0s = other(obs["target"]["ranks"][0]["loaded"][key])
    _rank_0_saved(obs, key, rank_0s)
    next(r for r in obs["target"]["ranks"] if r["rank"] == 1)["loaded"][key] = rank_0s
    assert derive("resume_2", obs) == []
    assert derive("resume_2", obs, RUN_PLAN.checkpointed_by(plan.own_shape())) == []


@pytest.mark.parametrize("case", ["fresh value", "one more key", "rank 0 holds rank 1's"])
def test_what_is_not_rank_0s_copy_on_another_rank_is_still_named_restored_late(case: str) -> None:
    """A load applied late leaves a fresh value, which may equal what another rank saved
    (state only one rank changes): only rank 0's copy on another rank passes, and only if every
    key that differs is one."""
    obs = real("resume_2")
    first, second = _model_keys(obs)[:2]
    rank_0s = other(obs["target"]["ranks"][0]["loaded"][first])
    _rank_0_saved(obs, first, rank_0s)
    ranks = {r["rank"]: r for r in obs["target"]["ranks"]}
    late = 1
    if case == "fresh value":
        ranks[1]["loaded"][first] = rank_0s.split(" ")[0] + " " + "2" * 64
    elif case == "one more key":
        ranks[1]["loaded"][first] = rank_0s
        ranks[1]["loaded"][second] = other(ranks[1]["loaded"][second])
    else:  # rank 0 lazily restores to what rank 1 saved
        ranks[0]["loaded"][first] = ranks[1]["loaded"][first]
        late = 0
    reasons, [caution] = judge("resume_2", obs)
    assert reasons == []
    assert caution.startswith(f"{diagnosis.RESTORED_LATE}: rank {late}: "), caution


def test_a_rank_restored_late_moves_no_other_ranks_step() -> None:
    """Rank 0 restored late stepped as the uninterrupted run did: rank 1's differing step is
    its own, state outside state_dict(), not a consequence of rank 0's load."""
    obs = real("resume_2")
    key = next(k for k in obs["target"]["ranks"][0]["loaded"] if k.startswith("app.rng"))
    ranks = {r["rank"]: r for r in obs["target"]["ranks"]}
    ranks[0]["loaded"][key] = other(ranks[0]["loaded"][key])
    ranks[1]["steps"][0]["loss"] = "0x1.0000000000000p-1"
    reasons, cautions = judge("resume_2", obs)
    assert [r.split(": ")[:2] for r in reasons] == [[diagnosis.OUTSIDE_STATE_DICT, "rank 1"]]
    assert [c.split(": ")[:2] for c in cautions] == [[diagnosis.RESTORED_LATE, "rank 0"]]


@pytest.mark.parametrize("own", [False, True])
def test_the_step_after_a_lost_key_is_filed_under_the_loss(own: bool) -> None:
    obs = real("resume_1")
    rank = obs["target"]["ranks"][0]
    key = _model_keys(obs)[0]
    rank["loaded"][key] = rank["steps"][0]["keys"][key] = other(rank["loaded"][key])
    the_plan = RUN_PLAN.checkpointed_by(plan.own_shape()) if own else RUN_PLAN
    cause = diagnosis.APP_ROUND_TRIP if own else diagnosis.ROUND_TRIP
    reasons = derive("resume_1", obs, the_plan)
    assert any(
        r.startswith(f"{cause}: rank 0: step 4 (resumed step 1) differs, a consequence")
        for r in reasons
    ), reasons


def test_batch_norm_statistics_dcp_kept_from_rank_1_name_the_broadcast() -> None:
    """Rank 0 loads rank 1's BatchNorm statistics (DCP's copy) and its steps differ: the hint
    says to make rank 0's the copy kept. Rank 0's copy on rank 1 would not fail at all."""
    obs = real("resume_2")
    key = "app.model.1.running_mean"
    value = next(iter(obs["target"]["ranks"][0]["loaded"].values()))
    for arm in ("reference", "repeat"):
        for r in obs[arm]["ranks"]:
            r["saved"][key] = other(value) if r["rank"] == 1 else value
        for r in obs[arm]["ranks"]:
            for step in r["steps"]:
                step["keys"][key] = value
    for r in obs["target"]["ranks"]:
        r["loaded"][key] = other(value)
        for step in r["steps"]:
            step["keys"][key] = other(value)
    reasons = derive("resume_2", obs)
    hints = [r for r in reasons if r.startswith("hint: BatchNorm")]
    assert len(hints) == 1 and "DCP kept rank 1's copy" in hints[0], reasons


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


# --- the arm that never saves ---------------------------------------------------------------


def _part_after_the_save(obs: dict[str, Any], step: int) -> str:
    """The arm that never saves takes another loss at resumed step ``step`` on rank 0."""
    rank = obs["never_saves"]["ranks"][0]
    rank["losses_after"][step - 1] = float.hex(float.fromhex(rank["losses_after"][step - 1]) + 1)
    return str(rank["losses_after"][step - 1])


@pytest.mark.parametrize("name", ["resume_1", "async_resume_2", "async_process_resume_1"])
def test_an_arm_that_never_saved_parting_after_the_save_is_the_save_changed_training(
    name: str,
) -> None:
    obs = real(name)
    n = obs["steps_before_save"]
    loss = _part_after_the_save(obs, 2)
    # What the save made that the run that never saved lacks: optimizer state.
    saved = obs["reference"]["ranks"][0]["objects"]["saved"]
    made = "app.head.state.0.step"
    saved[made] = "float32[] ~1"
    reasons = derive(name, obs)
    assert len(reasons) == 1, reasons
    assert reasons[0].startswith(
        f"{diagnosis.SAVE_CHANGED_TRAINING}: rank 0: a run that never saves and one that saved "
        f"after step {n} part at step {n + 2} (loss {diagnosis.number(loss)} vs "
    ), reasons
    assert f"the app's {made} (new after the save: float32[]) differ" in reasons[0]
    assert "_init_optim_state" in reasons[0]


def test_only_tensors_and_generators_the_save_changed_are_named() -> None:
    """A number the save moves (a count of saves) is bookkeeping, and no optimizer state was
    made: the reason stands on the losses and names nothing."""
    obs = real("resume_1")
    _part_after_the_save(obs, 1)
    obs["reference"]["ranks"][0]["objects"]["saved"]["app.saves"] = "int 1"
    (reason,) = derive("resume_1", obs)
    assert reason.startswith(f"{diagnosis.SAVE_CHANGED_TRAINING}: rank 0: ")
    assert "app.saves" not in reason and "likely" not in reason, reason


def test_an_arm_that_never_saved_parting_before_the_save_is_non_determinism() -> None:
    """Before the save it is one more uninterrupted run: parting there blames nothing."""
    obs = real("resume_2")
    rank = obs["never_saves"]["ranks"][1]
    rank["losses_before"][0] = float.hex(float.fromhex(rank["losses_before"][0]) + 1)
    _part_after_the_save(obs, 1)
    reasons = derive("resume_2", obs)
    assert [r.split(": ")[:2] for r in reasons] == [[diagnosis.NONDETERMINISTIC, "rank 1"]]
    assert "two uninterrupted runs differ at step 1 in the loss" in reasons[0]


def test_an_arm_that_never_saved_and_did_not_finish_is_named() -> None:
    obs = real("resume_1")
    obs["never_saves"]["ranks"][0]["losses_after"].pop()
    assert derive("resume_1", obs) == [
        f"uninterrupted run (never_saves) rank 0: did not take {obs['steps_before_save']} + "
        f"{obs['steps_after']} steps"
    ]
    obs["never_saves"] = None
    assert derive("resume_1", obs) == ["never_saves: did not run"]


def _rng_applied_at_the_first_step(obs: dict[str, Any], ranks: set[int]) -> None:
    """The restarted ``ranks`` load a fresh generator: their ``rng`` component differs from
    what they saved, while their step (and so its state) is the uninterrupted run's."""
    for rank in obs["target"]["ranks"]:
        if rank["rank"] in ranks:
            rank["loaded"]["rng"] = "7" * 64
    reaggregate(obs)


@pytest.mark.parametrize("stepped_alike", [True, False])
def test_the_restart_treats_a_load_applied_at_the_first_step_as_a_resume_does(
    stepped_alike: bool,
) -> None:
    """Hugging Face's Trainer restores its RNG just before the first step: after the torchrun
    restart, as in resume_<w>, a component that differs right after the load while the step
    matches is a warning, restored late; one that the step shows still did not round-trip."""
    name = "elastic_restart_2_to_2"
    obs = real(name)
    _rng_applied_at_the_first_step(obs, {0})
    if not stepped_alike:
        rank = next(r for r in obs["target"]["ranks"] if r["rank"] == 0)
        rank["next"]["loss"] = "0x1.8000000000000p-1"
    reasons, cautions = judge(name, obs)
    if stepped_alike:
        assert reasons == []
        assert [c.split(": ")[:2] for c in cautions] == [
            [diagnosis.RESTORED_LATE, "restarted rank 0"]
        ], cautions
        assert "differs from what was saved in rng, yet every resumed step matches" in cautions[0]
    else:
        assert cautions == []
        assert reasons[0].startswith(
            f"{diagnosis.ROUND_TRIP}: restarted rank 0: after load: component 'rng'"
        ), reasons


def _generator_differs_at_the_end(obs: dict[str, Any]) -> None:
    """Rank 0's generator ends otherwise than the uninterrupted run's, every step matching."""
    rank = next(r for r in obs["target"]["ranks"] if r["rank"] == 0)
    rank["objects"]["final"]["app.gen"] = "Generator ~999"


def _run_further(obs: dict[str, Any], *, parted_at: int | None = None) -> None:
    """The arms run further, as the driver records them: the arms' own records stand in for
    them (their steps match), without walks; ``parted_at``: a resumed step whose loss moves."""
    reference, target = copy.deepcopy(obs["reference"]), copy.deepcopy(obs["target"])
    for rank in reference["ranks"]:
        rank["objects"] = {"final": None, "saved": None}
    for rank in target["ranks"]:
        rank["objects"] = {"final": None, "loaded": None}
        if parted_at is not None and rank["rank"] == 0:
            rank["steps"][parted_at - 1]["loss"] = "0x1.8000000000000p-1"
    obs["further"] = {"steps_after": obs["steps_after"], "reference": reference, "target": target}


def test_a_generator_no_step_draws_from_run_further_is_a_warning() -> None:
    obs = real("resume_1")
    _generator_differs_at_the_end(obs)
    _run_further(obs)
    reasons, [caution] = judge("resume_1", obs)
    assert reasons == []
    assert caution.startswith(
        f"{diagnosis.OUTSIDE_STATE_DICT}: rank 0: every resumed step matches, yet after the 3 "
        "resumed steps the app's app.gen (Generator, differs) differ from the uninterrupted "
        "run's, yet all 3 resumed steps of a longer run match: no step drew from them."
    ), caution
    assert "--ignore-attr app.gen" in caution


def test_a_generator_a_later_step_draws_from_fails() -> None:
    obs = real("resume_1")
    _generator_differs_at_the_end(obs)
    _run_further(obs, parted_at=2)
    [reason], cautions = judge("resume_1", obs)
    assert cautions == []
    assert reason.startswith(f"{diagnosis.OUTSIDE_STATE_DICT}: rank 0: every resumed step"), reason
    assert "and run on to 3 resumed steps, step 5 (resumed step 2) differs in the loss" in reason
    assert "a torch.Generator is not saved" in reason and "--ignore-attr" not in reason


def test_a_generator_where_the_arms_cannot_run_further_is_a_warning_that_says_so() -> None:
    """A torchrun job (in-job) runs no arm after its one restart: no ``further``."""
    obs = real("resume_1")
    _generator_differs_at_the_end(obs)
    reasons, [caution] = judge("resume_1", obs)
    assert reasons == []
    assert "this host cannot run the arms further" in caution, caution


def test_arms_run_further_that_did_not_finish_fail() -> None:
    obs = real("resume_1")
    _generator_differs_at_the_end(obs)
    _run_further(obs)
    obs["further"]["target"] = None
    [reason], _ = judge("resume_1", obs)
    assert reason.endswith("the arms run on to 3 steps: target: did not run"), reason


def test_a_tensor_that_differs_at_the_end_fails_without_running_further() -> None:
    """An EMA the checkpoint leaves out: a later evaluation reads it, whatever a step does."""
    obs = real("resume_1")
    rank = next(r for r in obs["target"]["ranks"] if r["rank"] == 0)
    key = next(p for p in rank["objects"]["final"] if p.startswith("app.model."))
    rank["objects"]["final"][key] = rank["objects"]["final"][key].split(" ")[0] + " ~999"
    _run_further(obs)
    [reason], cautions = judge("resume_1", obs)
    assert cautions == [] and "state no loss shows" in reason, reason


def test_the_driver_runs_further_only_where_generators_alone_differ() -> None:
    from dcp_invariant.evidence.families._drawn_later import drawn_later

    obs = real("resume_1")
    assert not drawn_later(obs)
    _generator_differs_at_the_end(obs)
    assert drawn_later(obs)
    rank = next(r for r in obs["target"]["ranks"] if r["rank"] == 0)
    key = next(p for p in rank["objects"]["final"] if p.startswith("app.model."))
    rank["objects"]["final"][key] = rank["objects"]["final"][key].split(" ")[0] + " ~999"
    assert not drawn_later(obs)  # a tensor fails at once: nothing to run further for
