"""What workers do with a user's fixture: probe it, train and save it, resume it key by key.

Every leaf of ``{"app": app}``'s state dict is recorded per rank (:mod:`..state_keys`), at the
save, after the load and after every step, and the values are kept as snapshots in the
workspace so a later group can say by how much a key differs, not only that it does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from dcp_invariant.suite import state_keys
from dcp_invariant.suite.fixture import FixtureError, build_app, checked_loss, checked_state
from dcp_invariant.suite.scenarios.tasks import load_through_pointer
from dcp_invariant.suite.worker import Report


def fixture_probe(rank: int, world_size: int, payload: dict[str, Any], report: Report) -> None:
    """Check the fixture's interface before any scenario runs: a problem here is bad input.

    Problems with what the fixture returns are reported as ``problem``; an exception raised by
    the fixture's own code propagates, so its traceback reaches the log.
    """
    spec = payload["fixture"]
    try:
        app = build_app(spec, rank, world_size)
        state = checked_state(spec, app.state_dict())
        try:
            state_keys.record(state_keys.gather(state))
        except TypeError as exc:
            raise FixtureError(f"fixture {spec!r}: state_dict() holds {exc}") from exc
        checked_loss(spec, app.step())
    except (FixtureError, state_keys.StateKeyError) as exc:
        report({"problem": str(exc)})
        return
    report({"problem": None})


def fixture_train(rank: int, world_size: int, payload: dict[str, Any], report: Report) -> None:
    """Take N steps, save through DCP, then take K more: the uninterrupted arm (or a source)."""
    spec = payload["fixture"]
    app = build_app(spec, rank, world_size)
    record: dict[str, Any] = {"losses_before": [], "rank": rank, "saved": None, "steps": []}
    for _ in range(payload["steps_before"]):
        record["losses_before"].append(checked_loss(spec, app.step()).hex())
    dcp_save({"app": app}, storage_writer=FileSystemWriter(payload["checkpoint"]))
    record["saved"] = _observe(spec, app, payload["snapshots"], rank, "saved")
    report(record)
    for step in range(1, payload["steps_after"] + 1):
        loss = checked_loss(spec, app.step()).hex()
        keys = _observe(spec, app, payload["snapshots"], rank, f"step-{step}")
        record["steps"].append({"keys": keys, "loss": loss})
        report(record)


def fixture_resume(rank: int, world_size: int, payload: dict[str, Any], report: Report) -> None:
    """Load through the pointer into a fresh app, compare with the reference, take K steps."""
    spec = payload["fixture"]
    app = build_app(spec, rank, world_size)
    record = load_through_pointer(payload["store"], {"app": app}, rank)
    record.update(loaded=None, steps=[], diffs=[])
    if not record["verified_before_load"]:
        report(record)
        return
    reference = Path(payload["reference"])
    # The rank whose saved state this rank must hold: itself, or for a reshard from fewer ranks
    # the one it takes the place of (replicated values are the same on every source rank).
    source_rank = rank % payload["source_world_size"]
    record["loaded"] = _compare(
        spec, app, reference, source_rank, "saved", "loaded", record["diffs"]
    )
    report(record)
    for step in range(1, payload["steps_after"] + 1):
        loss = checked_loss(spec, app.step()).hex()
        phase = f"step-{step}"
        if payload["compare_steps"]:
            keys = _compare(spec, app, reference, source_rank, phase, phase, record["diffs"])
        else:
            keys = state_keys.record(state_keys.gather(checked_state(spec, app.state_dict())))
        record["steps"].append({"keys": keys, "loss": loss})
        report(record)


def _observe(spec: str, app: Any, snapshots: str, rank: int, phase: str) -> dict[str, str]:
    leaves = state_keys.gather(checked_state(spec, app.state_dict()))
    state_keys.save_snapshot(leaves, _snapshot_path(Path(snapshots), rank, phase))
    return state_keys.record(leaves)


def _compare(
    spec: str,
    app: Any,
    reference: Path,
    source_rank: int,
    reference_phase: str,
    phase: str,
    diffs: list[dict[str, Any]],
) -> dict[str, str]:
    leaves = state_keys.gather(checked_state(spec, app.state_dict()))
    path = _snapshot_path(reference, source_rank, reference_phase)
    if path.exists():
        diffs += state_keys.differences(state_keys.load_snapshot(path), leaves, phase)
    return state_keys.record(leaves)


def _snapshot_path(directory: Path, rank: int, phase: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"rank{rank}-{phase}.pt"
