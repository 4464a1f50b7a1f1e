"""The fixture probe (ranks/fixture_tasks.py), in this process: what it reports of an app that
steps outside the interface, before any scenario runs. That such a report becomes the CLI's one
line and exit 2, with nothing written, is shown end to end in tests/suite/test_fixture_live.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from dcp_invariant import plan
from dcp_invariant.commit.store import CheckpointStore
from dcp_invariant.ranks import checkpointing
from dcp_invariant.ranks.fixture_tasks import fixture_probe, fixture_resume, fixture_train
from dcp_invariant.suite.fixture import build_app
from dcp_invariant.suite.scenarios.payloads import FixtureProbe, FixtureResume, FixtureTrain

pytestmark = pytest.mark.torch


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no_step", "lacks step()"),
        ("not_a_mapping", "state_dict() returned a list, not a mapping"),
        ("bad_loss", "step() returned nan, expected a finite float"),
        # What DCP cannot save (measured with dcp.save at world size 1), named by key; every
        # kind of it is in test_state_keys.py, and one goes through the CLI.
        (
            "meta_state",
            "state_dict() holds app.extra.value, a tensor on the meta device (layout "
            "torch.strided, device meta), which DCP cannot save",
        ),
        (
            "expanded_state",
            "state_dict() holds app.extra.value, an expanded tensor (layout torch.strided, "
            "device cpu, strides [0]), which DCP saves but cannot load into",
        ),
        (
            "nested_state",
            "state_dict() holds app.extra.value, a nested tensor (layout torch.jagged, device "
            "cpu), which DCP cannot save",
        ),
    ],
)
def test_the_probe_reports_an_app_outside_the_interface_as_its_problem(
    one_rank_group: Any, name: str, message: str
) -> None:
    reported: list[dict[str, Any]] = []
    spec = f"fixture_loops:{name}"
    fixture_probe(0, 1, {"fixture": spec, "fixture_args": {}, "rank_local": []}, reported.append)
    last = reported[-1]
    assert last["phase"] == "done", reported
    assert last["problem"] is not None and last["problem"].startswith(f"fixture {spec!r}")
    assert message in last["problem"], last["problem"]
    assert "\n" not in last["problem"]


def test_the_probe_of_a_correct_app_reports_no_problem(one_rank_group: Any) -> None:
    reported: list[dict[str, Any]] = []
    payload: FixtureProbe = {
        "fixture": "fixture_loops:correct",
        "fixture_args": {},
        "rank_local": [],
    }
    fixture_probe(0, 1, payload, reported.append)
    assert [r["phase"] for r in reported] == [
        "build",
        "state_dict",
        "step",
        "state_dict_after_step",
        "done",
    ]
    assert reported[-1]["problem"] is None
    assert reported[-1]["shape"] == plan.DCP_SHAPE


@pytest.mark.parametrize("name", ["saves_itself", "opaque"])
def test_the_probe_finds_an_app_that_saves_itself(one_rank_group: Any, name: str) -> None:
    """With or without a state_dict() beside its own save() and load()."""
    reported: list[dict[str, Any]] = []
    payload: FixtureProbe = {
        "fixture": f"saving_loops:{name}",
        "fixture_args": {},
        "rank_local": [],
    }
    fixture_probe(0, 1, payload, reported.append)
    assert reported[-1]["problem"] is None, reported[-1]
    assert reported[-1]["shape"] == plan.own_shape(has_state=name == "saves_itself")


def test_an_app_with_save_but_no_load_is_its_problem(one_rank_group: Any) -> None:
    reported: list[dict[str, Any]] = []
    spec = "saving_loops:saves_only"
    fixture_probe(0, 1, {"fixture": spec, "fixture_args": {}, "rank_local": []}, reported.append)
    assert reported[-1]["problem"] == (
        f"fixture {spec!r} returned a SavesOnly with save() but no load(): an app that saves "
        "itself needs both save(checkpoint_dir) and load(checkpoint_dir)"
    )


def _train_commit_resume(
    name: str, workspace: Path, shape: plan.AppShape | None = None, async_save: bool = False
) -> dict[str, Any]:
    """An own-save app's arm at world size 1 (3 steps, its save, 2 more), its checkpoint sealed
    and promoted without .metadata, then a fresh app's resume through the pointer; the
    resumed rank's record. ``async_save``: the arm of an async_resume scenario."""
    spec = f"saving_loops:{name}"
    shape = plan.own_shape() if shape is None else shape
    trained: list[dict[str, Any]] = []
    train: FixtureTrain = {
        "objects": True,
        "ignored_attrs": [],
        "checkpoint": "store/candidates/step-3",
        "shape": shape,
        "fixture": spec,
        "fixture_args": {},
        "snapshots": "reference",
        "steps_after": 2,
        "steps_before": 3,
    }
    if async_save:
        train["async_mode"] = "app"
        train["timeout"] = 60.0
    fixture_train(0, 1, train, trained.append)
    assert trained[-1]["saved"] is not None and len(trained[-1]["steps"]) == 2
    store = CheckpointStore(workspace / "store", marker=None)
    store.seal("step-3")
    store.promote("step-3")
    resumed: list[dict[str, Any]] = []
    resume: FixtureResume = {
        "shape": shape,
        "compare_steps": True,
        "objects": True,
        "ignored_attrs": [],
        "fixture": spec,
        "fixture_args": {},
        "rank_local": [],
        "reference": "reference",
        "source_world_size": 1,
        "steps_after": 2,
        "store": "store",
    }
    fixture_resume(0, 1, resume, resumed.append)
    record = resumed[-1]
    record["reference"] = trained[-1]
    return record


def test_an_app_that_saves_itself_resumes_through_its_own_load(
    one_rank_group: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its files are sealed as they are, it loads the generation itself, and both what it
    loaded and its next steps equal the uninterrupted arm's, key by key and bit for bit."""
    monkeypatch.chdir(tmp_path)
    record = _train_commit_resume("saves_itself", tmp_path)
    assert record["verified_before_load"] and record["verified_after_load"], record
    assert record["load_error"] is None
    assert record["loaded"] == record["reference"]["saved"]
    assert record["diffs"] == []
    assert record["steps"] == record["reference"]["steps"]
    (generation,) = (tmp_path / "store" / "generations").glob("*[!n]")
    assert sorted(p.name for p in generation.iterdir()) == ["rank0.pt"]


def test_a_scheduler_the_apps_load_does_not_restore_is_named_by_key(
    one_rank_group: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    record = _train_commit_resume("scheduler_not_restored", tmp_path)
    assert record["load_error"] is None
    differing = {d["key"] for d in record["diffs"] if d["phase"] == "loaded"}
    assert differing and all(key.startswith("app.sched.") for key in differing), differing
    # The loaded optimizer keeps the saved lr for one step; the fresh scheduler then restarts
    # the warmup, and the second resumed step updates the model by another amount.
    assert any(
        d["phase"] == "step-2" and d["key"].startswith("app.model.") for d in record["diffs"]
    )


def test_an_apps_load_that_raises_is_recorded_by_its_exception_type(
    one_rank_group: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    record = _train_commit_resume("loads_the_wrong_file", tmp_path)
    assert record["load_error"] == {
        "kind": "app load",
        "key": None,
        "exception": "FileNotFoundError",
    }
    assert record["loaded"] is None and record["steps"] == []


ASYNC = plan.own_shape(saves_async=True)


def test_an_apps_async_save_is_waited_for_after_the_next_step(
    one_rank_group: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The future its save() returned is waited for after step N+1: the checkpoint holds step N,
    and nothing about the overlap is recorded, as the app's timing is its own."""
    monkeypatch.chdir(tmp_path)
    record = _train_commit_resume("saves_async", tmp_path, ASYNC, async_save=True)
    assert record["reference"]["async"] == {
        "pending_during_step": None,
        "staged_first": False,
        "upload_error": None,
    }
    assert record["loaded"] == record["reference"]["saved"] and record["diffs"] == []
    assert record["steps"] == record["reference"]["steps"]


def test_an_async_save_that_reads_the_state_late_holds_the_next_steps_state(
    one_rank_group: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    record = _train_commit_resume("writes_when_waited_for", tmp_path, ASYNC, async_save=True)
    after_step = record["reference"]["steps"][0]["keys"]
    model = [k for k in record["loaded"] if k.startswith("app.model.")]
    assert model and all(record["loaded"][k] == after_step[k] for k in model)
    assert all(record["loaded"][k] != record["reference"]["saved"][k] for k in model)


def test_an_app_that_declares_an_async_save_is_waited_for_in_a_synchronous_scenario(
    one_rank_group: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """resume_<w> saves it and waits at once: sealed only once the write is done."""
    monkeypatch.chdir(tmp_path)
    record = _train_commit_resume("saves_async", tmp_path, ASYNC)
    assert record["loaded"] == record["reference"]["saved"] and record["diffs"] == []


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "undeclared_future",
            "fixture: the app's save() returned a Future with result(), as an async save does: "
            "set saves_async = True on the app",
        ),
        (
            "saves_itself",
            "fixture: the app declares saves_async = True, but its save() returned a NoneType: "
            "return the save's future",
        ),
    ],
)
def test_a_save_that_returns_other_than_it_declares_stops_the_rank_with_one_line(
    one_rank_group: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    name: str,
    message: str,
) -> None:
    """Sealed before its write is done, a checkpoint would be called whole that is not."""
    monkeypatch.chdir(tmp_path)
    app = build_app(f"saving_loops:{name}", 0, 1)
    if name == "saves_itself":
        app.saves_async = True  # declared, but its save() returns nothing to wait for
    with pytest.raises(SystemExit):
        checkpointing.start(app, "checkpoint")
    assert capsys.readouterr().out.startswith(message)


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        (plan.DCP_SHAPE, "the plan has the tool (through DCP) save and load, but the app built"),
        (plan.own_shape(has_state=False), "the app built on this rank has a state_dict(), unlike"),
        (plan.own_shape(reshards=True), "the app built on this rank lacks reshards = True, unlike"),
    ],
)
def test_a_rank_whose_app_differs_from_the_planned_one_stops_with_one_line(
    one_rank_group: Any,
    capsys: pytest.CaptureFixture[str],
    shape: plan.AppShape,
    message: str,
) -> None:
    """A rank checked against another plan would be checked the wrong way, or vacuously."""
    app = build_app("saving_loops:saves_itself", 0, 1)
    checkpointing.expect(app, plan.own_shape())  # the planned shape: nothing to say
    with pytest.raises(SystemExit):
        checkpointing.expect(app, shape)
    assert capsys.readouterr().out.startswith(f"fixture: {message}")
