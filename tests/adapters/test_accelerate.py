"""The Accelerate adapter (dcp_invariant/adapters/accelerate.py) against accelerate 1.15.0 on
CPU/Gloo: its missing-framework line, one rank's save/load in this process, and live runs at
world sizes 1 and 2 (MULTI_CPU, DDP at two ranks) of a correct loop and two planted bugs
(``accelerate_loops``: the example and its planted bugs), each failing for its cause.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dcp_invariant.adapters import FrameworkMissing, framework

LAUNCHER = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def test_without_accelerate_the_adapter_says_which_extra_installs_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dcp_invariant.adapters.accelerate  # noqa: F401  # importable without its framework

    monkeypatch.setitem(sys.modules, "accelerate", None)  # import accelerate: ModuleNotFoundError
    with pytest.raises(FrameworkMissing) as caught:
        framework("accelerate", "accelerate", "accelerate")
    assert str(caught.value) == (
        "dcp_invariant.adapters.accelerate needs accelerate, which this Python lacks: "
        "pip install 'dcp-invariant[frameworks]' (or accelerate itself)"
    )


@pytest.fixture
def accelerate_world(one_rank_group: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A world of one with no launcher variables, Accelerate's singletons cleared after."""
    pytest.importorskip("accelerate")
    from dcp_invariant.adapters import accelerate as adapter

    for name in (*LAUNCHER, "ACCELERATE_USE_FSDP"):
        monkeypatch.delenv(name, raising=False)  # and put back as it was, after the test
    try:
        yield
    finally:
        adapter.reset()


@pytest.mark.torch
def test_one_rank_resumes_through_save_state_and_load_state(
    accelerate_world: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The app's own files, flat; what its load restored and its next steps equal the
    uninterrupted arm's; the adapter's process-wide changes are undone by reset()."""
    import accelerate_loops

    from dcp_invariant.adapters import accelerate as adapter
    from dcp_invariant.ranks import state_keys

    monkeypatch.chdir(tmp_path)
    app = accelerate_loops.correct(0, 1)
    assert app.accelerator.num_processes == 1
    assert os.environ["RANK"] == "0" and os.environ["LOCAL_WORLD_SIZE"] == "1"
    for _ in range(3):
        app.step()
    saved = state_keys.record(state_keys.gather(app.state_dict()))
    (tmp_path / "ckpt").mkdir()
    app.save("ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "custom_checkpoint_0.pkl",
        "model.safetensors",
        "optimizer.bin",
        "random_states_0.pkl",
        "scheduler.bin",
    ]
    assert all(p.is_file() for p in (tmp_path / "ckpt").iterdir())
    after = [app.step() for _ in range(3)]
    resumed = accelerate_loops.correct(0, 1)  # resets Accelerate's singletons first
    resumed.load("ckpt")
    assert state_keys.record(state_keys.gather(resumed.state_dict())) == saved
    assert [resumed.step() for _ in range(3)] == after
    assert {k for k in saved if k.startswith("app.random_states.")} >= {
        "app.random_states.torch_manual_seed",
        "app.random_states.random_state.state",
        "app.random_states.numpy_random_seed.keys",
        "app.random_states.step",
    }
    adapter.reset()
    assert not any(name in os.environ for name in LAUNCHER)


@pytest.mark.torch
def test_an_fsdp_plugin_accelerate_drops_on_cpu_stops_the_build(accelerate_world: None) -> None:
    import accelerate_loops

    from dcp_invariant.errors import FixtureError

    with pytest.raises(FixtureError, match=r"^Accelerate dropped its FSDP plugin: on CPU it runs "):
        accelerate_loops.fsdp2_plugin(0, 1)
    from dcp_invariant.adapters import accelerate as adapter

    adapter.reset()  # ACCELERATE_USE_FSDP, which the Accelerator set, is unset again
    assert "ACCELERATE_USE_FSDP" not in os.environ


# --- live: the tool's workers and torchrun ------------------------------------------------------


def derive(fixture: str, names: list[str], world_sizes: tuple[int, ...]) -> Any:
    import fixture_runs

    return fixture_runs.run(f"accelerate_loops:{fixture}", names, world_sizes)


@pytest.mark.live
def test_the_correct_loop_resumes_at_one_and_two_ranks_and_under_torchrun() -> None:
    pytest.importorskip("accelerate")
    names = ["resume_1", "resume_2", "elastic_restart_2_to_2", "half_written_2"]
    reasons, observations = derive("correct", names, (1, 2))
    assert reasons == {name: [] for name in names}, reasons
    # Each rank trains on its own shard of every batch: the models are equal at the save only
    # because DDP all-reduced the gradients (Accelerate ran MULTI_CPU, not two lone processes).
    saved = {r["rank"]: r["saved"] for r in _rank_records(observations["resume_2"]["reference"])}
    assert sorted(saved) == [0, 1], observations["resume_2"]["reference"]
    models = [{k: v for k, v in saved[r].items() if k.startswith("app.model.")} for r in (0, 1)]
    assert models[0] and models[0] == models[1]


@pytest.mark.live
def test_batch_norm_statistics_resumed_from_rank_0s_copy_are_no_false_alarm() -> None:
    """save_state keeps the main process's BatchNorm statistics: rank 1 resumes rank 0's, which
    DDP's forward broadcasts anyway; the observations show they differed at the save."""
    pytest.importorskip("accelerate")
    names = ["resume_2", "elastic_restart_2_to_2"]
    reasons, observations = derive("batch_norm", names, (2,))
    assert reasons == {name: [] for name in names}, reasons
    saved = {r["rank"]: r["saved"] for r in _rank_records(observations["resume_2"]["reference"])}
    loaded = {r["rank"]: r["loaded"] for r in observations["resume_2"]["target"]["ranks"]}
    key = "app.model.1.running_mean"
    assert saved[0][key] != saved[1][key], "the statistics differ by rank at the save"
    assert loaded[1][key] == saved[0][key]


def _rank_records(value: Any) -> Iterator[dict[str, Any]]:
    """The ranks' records of an arm: the dicts with a ``rank`` and what was ``saved``."""
    if isinstance(value, dict):
        if "rank" in value and isinstance(value.get("saved"), dict):
            yield value
            return
        value = list(value.values())
    if isinstance(value, list):
        for item in value:
            yield from _rank_records(item)


@pytest.mark.live
def test_a_position_save_state_never_saw_is_state_outside_state_dict() -> None:
    pytest.importorskip("accelerate")
    from dcp_invariant.evidence.diagnosis import OUTSIDE_STATE_DICT

    reasons, _ = derive("position_not_registered", ["resume_1"], (1,))
    assert reasons["resume_1"], reasons
    assert reasons["resume_1"][0].startswith(OUTSIDE_STATE_DICT), reasons


@pytest.mark.live
def test_a_data_position_restored_wrongly_is_named_by_key() -> None:
    pytest.importorskip("accelerate")
    from dcp_invariant.evidence.diagnosis import APP_ROUND_TRIP

    reasons, _ = derive("restarts_the_epoch", ["resume_2"], (2,))
    lost = [
        r
        for r in reasons["resume_2"]
        if r.startswith(APP_ROUND_TRIP) and "app.custom_checkpoint_0.batch" in r
    ]
    assert lost, reasons
    assert not any("DCP" in r for r in reasons["resume_2"]), reasons
