"""What workers do inside their process group: train, save, load through the pointer, step.

Every function here runs in a fresh worker (see :mod:`dcp_invariant.suite.worker`) and reports plain
records; the driver in the runner process turns them into observations. Checkpoint ids are
relative to the scenario workspace, so no path reaches DCP's metadata or the evidence.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from typing import Any

import numpy  # noqa: F401  (imported, so the probe reports the NumPy workers run with)
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from dcp_invariant import plan
from dcp_invariant.commit import ReceiptMismatch
from dcp_invariant.commit.store import CheckpointStore
from dcp_invariant.errors import AppRaised, FixtureError
from dcp_invariant.ranks import checkpointing
from dcp_invariant.ranks.digest import component_digests, value_digest
from dcp_invariant.suite.fixture import Anchored, build_app, load_fixture
from dcp_invariant.suite.scenarios.payloads import (
    DTensorLoad,
    DTensorSave,
    FixtureImports,
    LoadAndStep,
    RuntimeVersions,
    TrainAndSave,
)
from dcp_invariant.suite.worker import Reporter, imported_versions

DTENSOR_DTYPE = getattr(torch, plan.DTENSOR.dtype.removeprefix("torch."))
DTENSOR_SHAPE = plan.DTENSOR.shape
DTENSOR_PLACEMENTS = {"Shard(0)": [Shard(0)]}[plan.DTENSOR.placement]


class _CrashingWriter(FileSystemWriter):  # type: ignore[misc]  # torch is Any to mypy (pyproject.toml)
    """A writer whose chosen rank dies after writing its shard and before the commit marker."""

    def __init__(self, path: str, crash_rank: int, exit_code: int) -> None:
        super().__init__(path)
        self._crash_rank = crash_rank
        self._exit_code = exit_code

    def write_data(self, plan: Any, planner: Any) -> Any:
        future = super().write_data(plan, planner)
        if dist.get_rank() == self._crash_rank:
            future.wait()
            os._exit(self._exit_code)
        return future


def runtime_versions(
    rank: int, world_size: int, payload: RuntimeVersions, report: Reporter
) -> None:
    report(imported_versions())


def fixture_imports(rank: int, world_size: int, payload: FixtureImports, report: Reporter) -> None:
    """The fixture resolves here (its module and what it imports), and the versions imported:
    another release's ranks are probed so before any scenario (``--resume-with-torch``)."""
    try:
        load_fixture(payload["fixture"], payload["fixture_args"])
    except FixtureError as exc:
        report({"fixture_error": str(exc), **imported_versions()})
        return
    report({"fixture_error": None, **imported_versions()})


def train_and_save(rank: int, world_size: int, payload: TrainAndSave, report: Reporter) -> None:
    """Train, save at each planned step, then (optionally) take the uninterrupted next step."""
    app = build_app(payload["fixture"], rank, world_size, payload["fixture_args"])
    checkpointing.expect(app, payload["shape"])
    record: dict[str, Any] = {"rank": rank, "saves": [], "next": None}
    steps = 0
    for save in payload["saves"]:
        while steps < save["after_steps"]:
            app.step()
            steps += 1
        crash = save.get("crash")
        writer = None
        if crash is not None:
            writer = _CrashingWriter(save["checkpoint"], crash["rank"], crash["exit_code"])
        checkpointing.save(app, save["checkpoint"], writer)
        record["saves"].append(_digests(app))
        report(record)
    if payload["reference_step"]:
        record["next"] = _step(app)
        report(record)


def load_and_step(rank: int, world_size: int, payload: LoadAndStep, report: Reporter) -> None:
    """Load through the pointer into a fresh app; record what loaded and the next step."""
    app = build_app(payload["fixture"], rank, world_size, payload["fixture_args"])
    checkpointing.expect(app, payload["shape"])
    record = load_through_pointer(payload["store"], checkpointing.loader(app), rank)
    record["loaded"] = None
    record["next"] = None
    if record["verified_before_load"]:
        record["loaded"] = _digests(app)
        record["next"] = _step(app)
    report({**record, **payload.get("extra", {})})


def dtensor_save(rank: int, world_size: int, payload: DTensorSave, report: Reporter) -> None:
    mesh = init_device_mesh("cpu", (world_size,))
    global_tensor = (
        torch.arange(DTENSOR_SHAPE[0] * DTENSOR_SHAPE[1], dtype=DTENSOR_DTYPE).reshape(
            DTENSOR_SHAPE
        )
        / 8
        - 1
    )
    tensor = distribute_tensor(global_tensor, mesh, DTENSOR_PLACEMENTS)
    dcp_save({"tensor": tensor}, checkpoint_id=payload["checkpoint"])
    report(
        {
            "rank": rank,
            "local_shape": list(tensor.to_local().shape),
            "global_digest": value_digest(tensor.full_tensor()),
        }
    )


def dtensor_load(rank: int, world_size: int, payload: DTensorLoad, report: Reporter) -> None:
    mesh = init_device_mesh("cpu", (world_size,))
    tensor = distribute_tensor(
        torch.zeros(DTENSOR_SHAPE, dtype=DTENSOR_DTYPE), mesh, DTENSOR_PLACEMENTS
    )
    record = load_through_pointer(
        payload["store"], lambda path: dcp_load({"tensor": tensor}, checkpoint_id=path), rank
    )
    record["local_shape"] = None
    record["global_digest"] = None
    if record["verified_before_load"]:
        record["local_shape"] = list(tensor.to_local().shape)
        record["global_digest"] = value_digest(tensor.full_tensor())
    report(record)


def load_through_pointer(
    store_root: str, load: checkpointing.Loader, rank: int, *, record_load_error: bool = False
) -> dict[str, Any]:
    """Resolve and verify the pointer's generation, ``load`` it, verify it again.

    ``generation`` is the raw receipt digest; the driver turns it into a stable label.
    ``record_load_error``: a load DCP refuses is recorded as ``load_error`` (a reshard's keys
    that do not fit, say), and so is the app's own load's exception, instead of ending the rank
    with a traceback.
    """
    store = CheckpointStore(store_root)
    record: dict[str, Any] = {
        "rank": rank,
        "generation": None,
        "verified_before_load": False,
        "verified_after_load": False,
        "refused": [],
    }
    try:
        generation = store.resolve()
    except ReceiptMismatch as exc:
        record["refused"] = [f.to_record() for f in exc.failures]
        return record
    record["generation"] = generation.digest
    record["verified_before_load"] = True
    if record_load_error:
        record["load_error"] = None
        try:
            load(str(generation.path))
        except CheckpointException as exc:
            record["load_error"] = load_failure(exc, rank)
        except AppRaised as exc:
            if exc.method != "load":
                raise  # load_state_dict() inside DCP's load: the rank reports what raised
            traceback.print_exception(exc.error, file=sys.stderr)  # the user's frames, for the log
            # Only the type: the message may hold paths (the generation's, for one).
            record["load_error"] = {
                "kind": "app load",
                "key": None,
                "exception": type(exc.error).__name__,
            }
    else:
        load(str(generation.path))
    try:
        store.verify(generation)
    except ReceiptMismatch as exc:
        record["refused"] = [f.to_record() for f in exc.failures]
    else:
        record["verified_after_load"] = True
    return record


# The first key torch's default planner cannot load, and why (create_default_local_load_plan in
# torch/distributed/checkpoint/default_planner.py).
_MISSING_KEY = re.compile(r"Missing key in checkpoint state_dict: (.+?)\.?$")
_SIZE_MISMATCH = re.compile(r"Size mismatch between saved .* and current: .* for (.+)$")
# A checkpoint whose .metadata this torch cannot read: the load names the read's own failure
# ("metadata is None; global metadata read failed: ...", _load_state_dict in
# torch/distributed/checkpoint/state_dict_loader.py), unless this release raises it bare. A file
# another release wrote gives "too many values to unpack": TensorProperties.__setstate__ in
# torch/distributed/checkpoint/metadata.py unpacks the fields its own release pickles.
_UNREADABLE_METADATA = re.compile(
    r"^(metadata is None(?:; global metadata read failed: .*?)?)(?:; rank local metadata read failed.*)?$"
    r"|^(too many values to unpack.*|not enough values to unpack.*)$",
    re.DOTALL,
)


def load_failure(exc: CheckpointException, rank: int) -> dict[str, Any]:
    """This rank's own failure in a load DCP refused on every rank; what the evidence may hold.

    The key is the user's; the exception's message may hold paths, so only its type is kept.
    """
    own = exc.failures.get(rank)
    if own is None:
        return {"kind": "another rank", "key": None, "exception": None}
    error = own[0]
    message = str(error).strip()
    for kind, pattern in (("missing key", _MISSING_KEY), ("size mismatch", _SIZE_MISMATCH)):
        match = pattern.search(message)
        if match:
            return {"kind": kind, "key": match.group(1), "exception": None}
    unreadable = _UNREADABLE_METADATA.match(message)
    if unreadable:
        # torch's own words, kept where they name no file (the rank-local read's may: dropped).
        said = " ".join((unreadable.group(1) or unreadable.group(2)).split())[:300]
        shown = f"{type(error).__name__}: {said}" if not re.search(r"[/\\]", said) else None
        return {"kind": "unreadable metadata", "key": None, "exception": shown}
    return {"kind": "error", "key": None, "exception": type(error).__name__}


def _step(app: Any) -> dict[str, Any]:
    loss = app.step()
    return {"loss": float(loss).hex(), "digests": _digests(app)}


def _digests(app: Anchored) -> dict[str, str]:
    """Each component's digest; none for an app that saves itself and has no state_dict()."""
    return component_digests(app.state_dict()) if app.has_state else {}
