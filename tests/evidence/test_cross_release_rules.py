"""The cross_release rules on a real run's observation (tests/data/cross-release: the example
fixture saved by 2.13.0+cpu at world size 1, loaded by 2.14.1+cu130): a load the other release
refuses is named with DCP's words and, for 2.15's metadata, what changed; a key that changed
between releases fails; the two resumes on the other release must agree; the record must name
the releases its scenario does."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from dcp_invariant import canonical, plan
from dcp_invariant.evidence import diagnosis, observation, rules

DATA = Path(__file__).resolve().parents[1] / "data" / "cross-release"
NAME = "upgrade_2.13.0_to_2.14.1_1"
RUN_PLAN = plan.fixture_plan(
    "examples.mlp_fixture:fixture", (1, 2), resume_with_torch=["2.14.1"], torch_release="2.13.0"
)
FIVE = "AssertionError: metadata is None; global metadata read failed: too many values to unpack (expected 5)"


def real() -> dict[str, Any]:
    return copy.deepcopy(canonical.loads((DATA / f"{NAME}.json").read_bytes()))


def derive(obs: dict[str, Any], name: str = NAME, run_plan: plan.Plan = RUN_PLAN) -> list[str]:
    assert observation.validate(name, obs, run_plan=run_plan) == [], "the edit broke the shape"
    return rules.derive(name, obs, run_plan=run_plan)


def as_downgrade(obs: dict[str, Any]) -> tuple[dict[str, Any], str, plan.Plan]:
    """The same record, as 2.15.0 saving and 2.13.0 loading."""
    the_plan = plan.fixture_plan(
        "examples.mlp_fixture:fixture", (1, 2), resume_with_torch=["2.13.0"], torch_release="2.15.0"
    )
    obs["scenario"] = name = "downgrade_2.15.0_to_2.13.0_1"
    obs["torch"] = {"saved": "2.15.0+cu132", "loaded": "2.13.0+cpu"}
    return obs, name, the_plan


def refused(obs: dict[str, Any], error: dict[str, Any]) -> None:
    for group in ("target", "continued"):
        for rank in obs[group]["ranks"]:
            rank.update(loaded=None, steps=[], diffs=[], load_error=error)
        obs[group]["exit_codes"] = [0]


def test_the_real_upgrade_passes() -> None:
    assert derive(real()) == []


@pytest.mark.parametrize("said", [FIVE, FIVE.replace("(expected 5)", "(expected 5, got 6)")])
def test_a_downgrade_that_cannot_read_the_metadata_names_the_strides_field(said: str) -> None:
    """Python 3.14 says what it got, too: the note does not hang on the older wording."""
    obs, name, the_plan = as_downgrade(real())
    refused(obs, {"kind": "unreadable metadata", "key": None, "exception": said})
    reasons = derive(obs, name, the_plan)
    assert len(reasons) == 1
    reason = reasons[0]
    assert reason.startswith(f"{diagnosis.DOES_NOT_LOAD_ON_OTHER}: torch 2.13.0+cpu cannot load")
    assert "(downgrade)" in reason and said in reason
    assert "sixth field (strides)" in reason and "pytorch/pytorch#175011" in reason


def test_an_upgrade_that_cannot_load_names_dcps_error_only() -> None:
    """The strides note is for a file 2.15 or later wrote and an older release read: not here."""
    obs = real()
    refused(obs, {"kind": "unreadable metadata", "key": None, "exception": FIVE})
    (reason,) = derive(obs)
    assert "(upgrade)" in reason and FIVE in reason
    assert "strides" not in reason


def test_a_key_missing_on_the_other_release_is_named() -> None:
    obs = real()
    refused(obs, {"kind": "missing key", "key": "app.optim.state.0.step", "exception": None})
    (reason,) = derive(obs)
    assert "has no app.optim.state.0.step" in reason


def test_a_key_that_changed_between_releases_fails_first() -> None:
    obs = real()
    rank = obs["target"]["ranks"][0]
    key = sorted(rank["loaded"])[1]
    rank["loaded"][key] = "float32[16] " + "0" * 64
    reasons = derive(obs)
    assert reasons and all(r.startswith(diagnosis.CHANGED_ACROSS_RELEASES) for r in reasons)
    assert key in reasons[0] and "saved by torch 2.13.0+cpu, loaded by 2.14.1+cu130" in reasons[0]


def test_two_resumes_on_the_other_release_must_agree() -> None:
    obs = real()
    obs["continued"]["ranks"][0]["steps"][1]["loss"] = (0.5).hex()
    (reason,) = derive(obs)
    assert reason.startswith(f"{diagnosis.NONDETERMINISTIC}: rank 0: two resumes on torch 2.14.1")
    assert "resumed step 2" in reason


def test_the_steps_are_not_compared_with_the_release_that_saved() -> None:
    """Kernels may differ between releases: the saving arm's own K steps are not the bar."""
    obs = real()
    for rank in obs["source"]["ranks"]:
        rank["steps"][-1]["loss"] = (0.25).hex()
    assert derive(obs) == []


def test_a_record_naming_other_releases_than_its_scenario_fails() -> None:
    obs = real()
    obs["torch"]["loaded"] = "2.15.0+cu132"
    (reason,) = derive(obs)
    assert reason.startswith("torch: saved by 2.13.0+cpu and loaded by 2.15.0+cu132")


def test_provenance_takes_the_plans_optional_keys() -> None:
    """A run with --ignore-attr or --resume-with-torch records them in its plan, and verify
    reads that plan back (before this, an --ignore-attr run did not verify)."""
    from dcp_invariant.evidence import provenance

    for the_plan in (
        RUN_PLAN,
        plan.fixture_plan("examples.mlp_fixture:fixture", ignored_attrs=["app.cache"]),
    ):
        record = provenance.build(
            source_revision="0" * 40,
            torch_distribution="2.13.0+cpu",
            torch_runtime="2.13.0+cpu",
            numpy="2.4.6",
            run_plan=the_plan,
        )
        assert provenance.shape_problems(record) == []
        assert provenance.recorded_plan(record) == the_plan


def test_a_record_naming_no_release_at_all_is_a_reason_not_a_crash() -> None:
    obs = real()
    obs["torch"]["loaded"] = "2.14.1rc1"
    (reason,) = derive(obs)
    assert reason.startswith("torch: saved by 2.13.0+cpu and loaded by 2.14.1rc1, not the releases")


def test_an_unreadable_metadata_on_the_same_release_is_a_round_trip_failure() -> None:
    """resume and reshard share the load-failure wording: the new kind reads there too."""
    from dcp_invariant.evidence.families._fixture_arms import load_failures

    scenario = RUN_PLAN.scenario("resume_1")
    ranks = [
        {"rank": 0, "load_error": {"kind": "unreadable metadata", "key": None, "exception": None}}
    ]
    (reason,) = load_failures(scenario, ranks, lambda r: f"resumed rank {r}")
    assert reason.startswith(f"{diagnosis.ROUND_TRIP}: resumed rank 0: DCP could not read")
    assert "None" not in reason


def _at_two_ranks(obs: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The record as two ranks would give it, rank 1 a copy of rank 0."""
    name = NAME.removesuffix("_1") + "_2"
    obs.update(scenario=name, source_world_size=2, target_world_size=2)
    for group in ("source", "target", "continued"):
        obs[group]["ranks"].append({**copy.deepcopy(obs[group]["ranks"][0]), "rank": 1})
        obs[group]["exit_codes"] = [0, 0]
    shard = next(f for f in obs["commit"]["files"] if f["path"] == "__0_0.distcp")
    obs["commit"]["files"] = sorted(
        [*obs["commit"]["files"], {**shard, "path": "__1_0.distcp"}], key=lambda f: f["path"]
    )
    return obs, name


def test_rank_0s_copy_of_a_value_that_differs_by_rank_is_no_release_change() -> None:
    """DDP's BatchNorm statistics: rank 1 saved its own, the checkpoint kept rank 0's (Fabric
    saves rank 0's state alone), and torch B loads rank 0's on rank 1, as torch A's own resume
    of the same save does: resume_<w> judges that; no release changed it. Another value is."""
    obs, name = _at_two_ranks(real())
    key = next(k for k in obs["source"]["ranks"][0]["saved"] if k.startswith("app.model."))
    saved_1 = obs["source"]["ranks"][1]["saved"]
    saved_1[key] = saved_1[key].split(" ")[0] + " " + "1" * 64
    assert derive(obs, name) == []
    target_1 = obs["target"]["ranks"][1]
    target_1["loaded"][key] = saved_1[key].split(" ")[0] + " " + "2" * 64
    [reason] = derive(obs, name)
    assert reason.startswith(f"{diagnosis.CHANGED_ACROSS_RELEASES}: rank 1 "), reason
    assert key in reason
