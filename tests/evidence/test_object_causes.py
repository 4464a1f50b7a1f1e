"""The app's own objects as evidence (evidence/object_causes.py): which attributes differ, how
they are shown, what they most likely mean; volatile ones never named."""

from __future__ import annotations

from dcp_invariant.evidence import object_causes

DIGEST_A, DIGEST_B = "~1", "~2"  # digests as settle() labels them
SAVED = {
    "app.model.0.weight": f"float32[4,4] {DIGEST_A}",
    "app.sampler.epoch": "int 2",
    "app.scaler._scale": f"float32[] {DIGEST_A}",
    "app.started": "float 0x1.0p+30",
    "app.where": f"str {DIGEST_A}",
    "rng.torch": f"ByteTensor {DIGEST_A}",
}


def test_volatile_attributes_are_the_ones_two_uninterrupted_runs_disagree_on() -> None:
    repeat = {**SAVED, "app.started": "float 0x1.8p+30"}
    assert object_causes.volatile(SAVED, repeat) == {"app.started"}
    assert object_causes.volatile(SAVED, None) == set()


def test_what_differs_is_named_with_numbers_shown_and_tensors_by_kind() -> None:
    loaded = {
        **SAVED,
        "app.sampler.epoch": "int 0",
        "app.scaler._scale": f"float32[] {DIGEST_B}",
        "app.started": "float 0x1.8p+30",
        "app.loaded_from": f"str {DIGEST_B}",
    }
    del loaded["app.where"]
    # What the two uninterrupted runs disagreed on reads volatile in every walk (settle).
    marked = {**SAVED, "app.started": object_causes.VOLATILE}
    loaded["app.started"] = object_causes.VOLATILE
    paths = object_causes.differing(marked, loaded)
    assert paths == ["app.loaded_from", "app.sampler.epoch", "app.scaler._scale", "app.where"]
    assert object_causes.shown(SAVED, loaded, paths, "saved", "loaded") == (
        "app.loaded_from (new loaded: str), app.sampler.epoch (saved int 2, loaded int 0), "
        "app.scaler._scale (float32[], differs), app.where (saved str, missing loaded)"
    )


def test_more_than_eight_are_counted() -> None:
    many = {f"app.c{i}": f"int {i}" for i in range(10)}
    paths = object_causes.differing(many, {})
    assert object_causes.shown(many, {}, paths, "saved", "loaded").endswith(", 2 more")


def test_the_end_of_a_resume_judges_the_apps_tensors_and_generators_only() -> None:
    """A counter or a string that differs without a loss showing it is bookkeeping; the global
    RNGs move with other processes' history."""
    final = {
        **SAVED,
        "app.gen": f"Generator {DIGEST_A}",
        "app.ema.module.0.weight": f"float32[4,4] {DIGEST_A}",
    }
    resumed = {
        **final,
        "app.sampler.epoch": "int 9",
        "app.where": f"str {DIGEST_B}",
        "rng.torch": f"ByteTensor {DIGEST_B}",
        "app.scaler._scale": f"float32[] {DIGEST_B}",
        "app.gen": f"Generator {DIGEST_B}",
        "app.ema.module.0.weight": f"float32[4,4] {DIGEST_B}",
    }
    assert object_causes.at_the_end(final, resumed) == [
        "app.ema.module.0.weight",
        "app.gen",
        "app.scaler._scale",
    ]
    volatile = {"app.gen": object_causes.VOLATILE}
    assert object_causes.at_the_end({**final, **volatile}, {**resumed, **volatile}) == [
        "app.ema.module.0.weight",
        "app.scaler._scale",
    ]


def test_each_kind_of_state_users_leave_out_has_its_fix() -> None:
    causes = object_causes.likely_causes(
        [
            "app.scaler._growth_tracker",
            "app.teacher.module.0.weight",
            "app.loader.sampler.epoch",
            "rng.python",
            "app.generator",
            "app.optim.state.3.exp_avg",
        ]
    )
    assert [c.split(" is ")[0].split(":")[0] for c in causes] == [
        "a loss scaler (GradScaler)",
        "an EMA or averaged model",
        "a sampler's or loader's epoch",
        "a global RNG",
        "a torch.Generator",
        "the optimizer's state",
    ]
    assert object_causes.likely_causes(["app.model.0.weight", "app.steps"]) == []


def _group(*walks: dict[str, dict[str, str] | None]) -> dict[str, object]:
    return {"ranks": [{"rank": r, "objects": w} for r, w in enumerate(walks)]}


def test_settling_makes_the_records_repeat_from_run_to_run() -> None:
    """What the two arms disagree on is volatile in all three; what only the resumed arm has is
    kept by kind; the rest is left as recorded."""
    first = _group({"saved": {"a": "int 1", "t": "float 0x1p+0"}, "final": {"a": "int 2"}})
    second = _group({"saved": {"a": "int 1", "t": "float 0x1.8p+0"}, "final": {"a": "int 2"}})
    resumed = _group(
        {
            "loaded": {"a": "int 1", "t": "float 0x1.4p+0", "new": "float 0x1.2p+0"},
            "final": {"a": "int 2", "w": f"float32[2] {DIGEST_A}"},
        }
    )
    object_causes.settle(first, second, resumed)
    assert first["ranks"][0]["objects"]["saved"] == {"a": "int 1", "t": "volatile"}  # type: ignore[index]
    assert second["ranks"][0]["objects"]["saved"]["t"] == "volatile"  # type: ignore[index]
    assert resumed["ranks"][0]["objects"] == {  # type: ignore[index]
        "loaded": {"a": "int 1", "t": "volatile", "new": "float"},
        "final": {"a": "int 2", "w": "float32[2]"},
    }


def test_digests_become_labels_numbered_by_first_appearance() -> None:
    """Equal labels are equal values, and a digest that every arm of a run shares but another
    run does not (NumPy's global RNG) gets the same label in both runs."""
    one, two = "1" * 64, "2" * 64
    first = _group({"saved": {"g": f"state {one}", "w": f"float32[2] {two}"}, "final": None})
    second = _group({"saved": {"g": f"state {one}", "w": f"float32[2] {two}"}, "final": None})
    resumed = _group({"loaded": {"g": f"state {two}", "w": f"float32[2] {two}"}, "final": None})
    object_causes.settle(first, second, resumed)
    # Across observations: one run's labels, in the order the artifact stores them.
    other = {"reference": _group({"saved": {"g": f"state {two}"}, "final": None})}
    object_causes.intern([{"reference": first, "repeat": second, "target": resumed}, other])
    assert first["ranks"][0]["objects"]["saved"] == {"g": "state ~1", "w": "float32[2] ~2"}  # type: ignore[index]
    assert resumed["ranks"][0]["objects"]["loaded"] == {"g": "state ~2", "w": "float32[2] ~2"}  # type: ignore[index]
    assert other["reference"]["ranks"][0]["objects"]["saved"] == {"g": "state ~2"}  # type: ignore[index]
    object_causes.settle(None, None, None)  # a scenario stopped before any arm ran
    object_causes.intern([{"reference": None, "target": None}])


def test_ignored_attributes_are_left_out_of_every_walk() -> None:
    """An ignored path and everything below it, in both arms and the resumed one; a path
    that only starts with the same letters is kept."""
    walk = {"app.ema": "int 1", "app.ema.w": f"float32[2] {'1' * 64}", "app.emaf": "int 2"}
    first, second = (
        _group({"saved": dict(walk), "final": None}),
        _group({"saved": dict(walk), "final": None}),
    )
    resumed = _group({"loaded": dict(walk), "final": dict(walk)})
    object_causes.settle(first, second, resumed, ("app.ema",))
    for group, phase in (
        (first, "saved"),
        (second, "saved"),
        (resumed, "loaded"),
        (resumed, "final"),
    ):
        assert group["ranks"][0]["objects"][phase] == {"app.emaf": "int 2"}  # type: ignore[index]


def test_a_walk_not_made_is_left_alone() -> None:
    first = _group({"saved": None, "final": None})
    resumed = _group({"loaded": {"a": "int 1"}, "final": None})
    object_causes.settle(first, None, resumed)
    assert resumed["ranks"][0]["objects"] == {"loaded": {"a": "int 1"}, "final": None}  # type: ignore[index]


def test_an_alias_one_run_keeps_moves_a_path_and_proves_nothing_at_the_end() -> None:
    """A load() that holds {"model": self.model} makes the resumed walk record the model under
    that path first: the uninterrupted run's app.model.* are then absent, not different."""
    final = {"app.model.weight": f"float32[2] {DIGEST_A}"}
    resumed = {"app.ckpt.model.weight": f"float32[2] {DIGEST_A}"}
    assert object_causes.at_the_end(final, resumed) == []


def test_a_counter_named_like_a_generator_is_not_one() -> None:
    assert object_causes.likely_causes(["app.general_steps"]) == []
    assert object_causes.likely_causes(["app.gen"]) == object_causes.likely_causes(["app.data_rng"])


def test_the_arm_that_never_saves_is_settled_with_the_arms_that_save() -> None:
    """Volatile where the two arms that save disagree, ignored paths left out, and its digests
    labelled with theirs (after them): equal labels across the arms are equal values."""
    one, two = "1" * 64, "2" * 64
    first = _group({"saved": {"t": "int 1", "w": f"float32[2] {one}"}, "final": None})
    second = _group({"saved": {"t": "int 2", "w": f"float32[2] {one}"}, "final": None})
    never = _group(
        {"saved": {"t": "int 3", "w": f"float32[2] {two}", "app.ema": "int 1"}, "final": None}
    )
    object_causes.settle(first, second, None, ("app.ema",), never_saves=never)
    object_causes.intern([{"reference": first, "never_saves": never, "repeat": second}])
    assert never["ranks"][0]["objects"]["saved"] == {"t": "volatile", "w": "float32[2] ~2"}  # type: ignore[index]
    assert first["ranks"][0]["objects"]["saved"]["w"] == "float32[2] ~1"  # type: ignore[index]


def test_what_a_save_changed_is_its_tensors_and_generators() -> None:
    """New optimizer state and a changed tensor are named, with their likely cause; a number
    the save moved and the global RNGs are not."""
    never = {"app.w": "float32[2] ~1", "app.saves": "int 0", "rng.torch": "ByteTensor ~2"}
    saved = {
        "app.w": "float32[2] ~3",
        "app.saves": "int 1",
        "rng.torch": "ByteTensor ~4",
        "app.head_opt.state.0.step": "float32[] ~5",
    }
    paths = object_causes.changed_by_save(never, saved)
    assert paths == ["app.head_opt.state.0.step", "app.w"]
    (cause,) = object_causes.save_causes(paths)
    assert "_init_optim_state" in cause and "pytorch#140898" in cause
    assert object_causes.save_causes(["app.w"]) == []


def test_the_end_of_a_resume_is_judged_alike_before_and_after_labelling() -> None:
    """The runner judges each scenario on raw digests as it ends; the artifact on labels."""
    raw = {"app.ema.w": f"float32[2] {'1' * 64}"}
    moved = {"app.ema.w": f"float32[2] {'2' * 64}"}
    assert object_causes.at_the_end(raw, moved) == ["app.ema.w"]
    assert object_causes.changed_by_save(raw, moved) == ["app.ema.w"]
