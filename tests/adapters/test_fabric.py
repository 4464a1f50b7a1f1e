"""dcp_invariant.adapters.fabric against Lightning 2.6.6 (the `frameworks` extra): loops
checkpointed with fabric.save and fabric.load, on CPU/Gloo in the tool's own process group,
with no launcher variable set (``fabric_loops`` beside this directory)."""

from __future__ import annotations

import sys

import pytest

from dcp_invariant.adapters import FrameworkMissing
from dcp_invariant.evidence.diagnosis import APP_ROUND_TRIP

pytest.importorskip(
    "lightning", reason="needs the frameworks extra: pip install -e '.[frameworks]'"
)


def run(fixture: str, names: list[str], world_sizes: tuple[int, ...]) -> dict[str, list[str]]:
    import fixture_runs

    return fixture_runs.run(f"fabric_loops:{fixture}", names, world_sizes)[0]


@pytest.mark.live
def test_a_correct_fabric_loop_under_ddp_resumes_exactly_at_two_ranks() -> None:
    """No false alarm; and fabric.load refuses its save cut short."""
    names = ["resume_2", "half_written_2"]
    assert run("ddp", names, (2,)) == {name: [] for name in names}


@pytest.mark.live
def test_ddp_batch_norm_statistics_resumed_from_rank_0s_copy_are_no_false_alarm() -> None:
    """Each rank's BatchNorm statistics differ at the save and fabric.save keeps rank 0's: rank
    1 resumes them, DDP's forward broadcasts rank 0's anyway, and every step matches. Fabric's
    save and DDP's broadcast are what make it so: the observations show rank 1 loaded rank 0's
    statistics, not its own."""
    import fixture_runs

    names = ["resume_2", "elastic_restart_2_to_2"]
    reasons, observed = fixture_runs.run("fabric_loops:ddp_batch_norm", names, (2,))
    assert reasons == {name: [] for name in names}
    saved = {r["rank"]: r["saved"] for r in observed["resume_2"]["reference"]["ranks"]}
    loaded = {r["rank"]: r["loaded"] for r in observed["resume_2"]["target"]["ranks"]}
    key = "app.model.1.running_mean"
    assert saved[0][key] != saved[1][key], "the statistics differ by rank at the save"
    assert loaded[1][key] == saved[0][key] == loaded[0][key]


@pytest.mark.live
def test_the_fsdp2_example_resumes_exactly_and_reshards_as_it_declares() -> None:
    """FSDP2 through ModelParallelStrategy (a loop that restores what Fabric's load leaves as
    raw state dicts): no false alarm at two ranks, fabric.load refuses its save cut short, and
    its sharded checkpoint, saved at one rank, loads at two with every key as it was saved."""
    import fixture_runs

    names = ["resume_2", "half_written_2", "reshard_1_to_2"]
    reasons, observed = fixture_runs.run("fabric_loops:model_parallel", names, (1, 2))
    assert reasons == {name: [] for name in names}
    loaded = [rank["loaded"] for rank in observed["reshard_1_to_2"]["target"]["ranks"]]
    assert len(loaded) == 2 and all(
        any(k.startswith("app.model.") for k in keys) for keys in loaded
    )


@pytest.mark.live
def test_a_loop_trusting_fabric_load_under_model_parallel_is_named_by_its_scheduler() -> None:
    """Lightning 2.6.6's ModelParallelStrategy load replaces a stateful scheduler with the state
    dict it read (``state[key] = metadata.pop(key)``): the scheduler stays fresh."""
    (reasons,) = run("model_parallel_trusting_fabric_load", ["resume_1"], (1,)).values()
    lost = {r.split(": ")[2] for r in reasons if r.startswith(APP_ROUND_TRIP + ": rank 0: ")}
    assert "app.scheduler.last_epoch" in lost, reasons
    assert "app.position.cursor" in lost, reasons
    assert not any(key.startswith(("app.model.", "app.optimizer.")) for key in lost), reasons


def test_without_lightning_the_adapter_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from dcp_invariant.adapters import fabric

    monkeypatch.setitem(sys.modules, "lightning", None)
    monkeypatch.delitem(sys.modules, "lightning.fabric", raising=False)
    with pytest.raises(FrameworkMissing) as raised:
        fabric.app(lambda make: pytest.fail("built without Lightning"))
    assert str(raised.value) == (
        "dcp_invariant.adapters.fabric needs lightning, which this Python lacks: "
        "pip install 'dcp-invariant[frameworks]' (or lightning itself)"
    )
