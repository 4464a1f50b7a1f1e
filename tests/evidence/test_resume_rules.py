"""The resume rules on a real fixture run's observations (tests/data/fixture-artifact): what
the load got and what the resumed steps did, each naming its cause."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from artifact_data import DATA_ARTIFACT

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


def test_a_copy_of_another_ranks_value_that_the_first_step_overwrites_passes() -> None:
    """A value that differs by rank at the save (DDP's BatchNorm buffers) and one rank's copy
    kept (Fabric saves rank 0's state alone; DCP keeps one copy): rank 1 resumes rank 0's, its
    steps all match, since DDP's forward broadcasts rank 0's buffers. Nothing was lost, and a
    checkpoint taken right after the load holds the same copy: no reason. A value no rank
    saved is still restored late."""
    obs = real("resume_2")
    ranks = {r["rank"]: r for r in obs["target"]["ranks"]}
    key = next(k for k in ranks[0]["loaded"] if k.startswith("app.model."))
    rank_0s = other(ranks[0]["loaded"][key])
    for arm in ("reference", "repeat"):
        next(r for r in obs[arm]["ranks"] if r["rank"] == 0)["saved"][key] = rank_0s
    ranks[0]["loaded"][key] = ranks[1]["loaded"][key] = rank_0s
    assert derive("resume_2", obs) == []
    assert derive("resume_2", obs, RUN_PLAN.checkpointed_by(plan.own_shape())) == []

    ranks[1]["loaded"][key] = rank_0s.split(" ")[0] + " " + "2" * 64
    [reason] = derive("resume_2", obs)
    assert reason.startswith(f"{diagnosis.RESTORED_LATE}: rank 1: "), reason


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
