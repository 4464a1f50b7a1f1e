"""Diagnoses from per-key records alone: the sentences the runner prints and the verifier re-derives."""

from __future__ import annotations

from typing import Any

from dcp_invariant.evidence import diagnosis

A, B, C = "a" * 64, "b" * 64, "c" * 64


def keys(**entries: str) -> dict[str, str]:
    return {f"app.{k.replace('__', '.')}": v for k, v in entries.items()}


def step(loss: str, **entries: str) -> dict[str, Any]:
    return {"loss": loss, "keys": keys(**entries)}


def test_number_gives_decimal_and_hex() -> None:
    assert diagnosis.number((0.75).hex()) == "0.75 (0x1.8000000000000p-1)"
    assert diagnosis.number("junk") == "junk"


def test_round_trip_names_missing_new_changed_and_retyped_keys() -> None:
    saved = keys(w=f"float32[2] {A}", m=f"float32[2] {A}", s=f"int64[] {A}")
    loaded = keys(w=f"float16[2] {B}", s=f"int64[] {C}", extra=f"int {A}")
    diffs = [{"key": "app.w", "max_abs_diff": (0.5).hex(), "phase": "loaded"}]
    reasons = diagnosis.round_trip("rank 0", saved, loaded, {}, diffs)
    assert reasons == [
        "did not round-trip through DCP: rank 0: app.extra: int after load, never saved",
        "did not round-trip through DCP: rank 0: app.m: saved float32[2], missing after load",
        "did not round-trip through DCP: rank 0: app.s: loaded int64[] differs from saved",
        "did not round-trip through DCP: rank 0: app.w: saved float32[2], loaded float16[2] "
        "(dtype or shape changed) (max abs diff 0.5)",
    ]
    assert diagnosis.round_trip("rank 0", saved, saved, {}, []) == []


def test_round_trip_names_the_rank_whose_value_dcp_kept() -> None:
    saved = {0: keys(noise=f"uint8[8] {A}"), 1: keys(noise=f"uint8[8] {B}")}
    reasons = diagnosis.round_trip("rank 1", saved[1], saved[0], {0: saved[0]}, [])
    assert len(reasons) == 1
    assert "it holds rank 0's saved value: DCP keeps one copy" in reasons[0]


def test_round_trip_caps_the_keys_it_names() -> None:
    saved = {f"app.k{i:02}": f"int {A}" for i in range(12)}
    loaded = {k: f"int {B}" for k in saved}
    reasons = diagnosis.round_trip("rank 0", saved, loaded, {}, [])
    assert len(reasons) == diagnosis.MAX_KEYS_NAMED + 1
    assert reasons[-1].endswith("rank 0: 4 more keys differ")


def test_hints_point_at_get_state_dict_for_an_emptied_optimizer_and_at_casts() -> None:
    saved = keys(optim__state__0__exp_avg=f"float32[2] {A}")
    loaded = keys(optim__state=f"map[0] {B}")
    [hint] = diagnosis.round_trip_hints(saved, loaded)
    assert "get_state_dict / set_state_dict" in hint
    [cast] = diagnosis.round_trip_hints(keys(w=f"float32[2] {A}"), keys(w=f"bfloat16[2] {A}"))
    assert "dtype or shape changed" in cast


def test_batch_norm_statistics_holding_another_ranks_copy_point_at_ddps_broadcast() -> None:
    saved = keys(bn__running_mean=f"float32[4] {A}", w=f"float32[4] {A}")
    loaded = keys(bn__running_mean=f"float32[4] {B}", w=f"float32[4] {A}")
    rank_1 = keys(bn__running_mean=f"float32[4] {B}", w=f"float32[4] {A}")
    [hint] = diagnosis.round_trip_hints(saved, loaded, {1: rank_1})
    assert hint.startswith("hint: BatchNorm's running statistics differ by rank")
    assert "broadcast them from rank 0 in state_dict()" in hint
    assert "DCP kept rank 1's copy" in hint
    # Not another rank's copy (a load that lost it, at one rank), rank 0's (which passes when
    # the steps match), a key missing on both sides, a key that is no statistic: no hint.
    assert diagnosis.round_trip_hints(saved, loaded, {}) == []
    assert diagnosis.round_trip_hints(saved, loaded, {1: keys(w=f"float32[4] {A}")}) == []
    assert diagnosis.round_trip_hints(saved, loaded, {0: rank_1}) == []
    missing = keys(w=f"float32[4] {A}")
    assert diagnosis.round_trip_hints(saved, missing, {1: keys(w=f"float32[4] {C}")}) == []
    other_key = keys(w=f"float32[4] {B}")
    assert diagnosis.round_trip_hints(keys(w=f"float32[4] {A}"), other_key, {1: other_key}) == []


def test_step_divergence_blames_state_outside_state_dict_only_when_loads_matched() -> None:
    reference = [step("0x1.0p+0", w=f"float32[2] {A}"), step("0x1.0p-1", w=f"float32[2] {B}")]
    resumed = [reference[0], step("0x1.8p-1", w=f"float32[2] {C}")]
    [reason] = diagnosis.step_divergence("rank 0", reference, resumed, [], 3, True)
    assert reason.startswith(
        "state outside state_dict(): rank 0: loaded == saved, but step 5 (resumed step 2) differs"
    )
    assert "loss expected 0.5 (0x1.0p-1), got 0.75 (0x1.8p-1)" in reason
    assert "keys that differ first: app.w" in reason
    # A step that follows from a lost key is filed under the loss's cause, as check() groups it.
    [consequence] = diagnosis.step_divergence("rank 0", reference, resumed, [], 3, False)
    assert consequence.startswith(
        "did not round-trip through DCP: rank 0: step 5 (resumed step 2) differs, a consequence"
    )
    [own] = diagnosis.step_divergence(
        "rank 0", reference, resumed, [], 3, False, lost=diagnosis.APP_ROUND_TRIP
    )
    assert own.startswith(f"{diagnosis.APP_ROUND_TRIP}: rank 0: step 5")
    assert diagnosis.step_divergence("rank 0", reference, reference, [], 3, True) == []


def test_a_moved_learning_rate_names_the_scheduler() -> None:
    reference = [step("0x1.0p+0", optim__param_groups__0__lr=f"float {A}")]
    resumed = [step("0x1.0p+0", optim__param_groups__0__lr=f"float {B}")]
    reasons = diagnosis.step_divergence("rank 0", reference, resumed, [], 3, True)
    assert any("an LR scheduler whose state is not in state_dict()" in r for r in reasons)


def test_nondeterminism_finds_the_first_step_where_two_runs_part() -> None:
    first = {"losses_before": ["0x1.0p+0", "0x1.0p-1"], "saved": keys(w=f"int {A}"), "steps": []}
    same = dict(first)
    assert diagnosis.nondeterminism("rank 0", first, same) == []
    second = {**first, "losses_before": ["0x1.0p+0", "0x1.8p-1"]}
    [reason] = diagnosis.nondeterminism("rank 0", first, second)
    assert reason.startswith(
        "non-deterministic fixture: rank 0: two uninterrupted runs differ at step 2"
    )
    third = {**first, "saved": keys(w=f"int {B}")}
    [keyed] = diagnosis.nondeterminism("rank 0", first, third)
    assert "differ at step 2 in app.w" in keyed
