"""What workers do with a user's fixture: probe it, train and save it, resume it key by key.

Every leaf of ``{"app": app}``'s state dict (where an app that saves itself has one) is
recorded per rank (:mod:`..state_keys`), at the save, after the load and after every step, and
the values are kept as snapshots in the workspace so a later group can say by how much a key
differs, not only that it does.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import threading
import time
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch._C._distributed_c10d import TCPStore
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import (
    AsyncCheckpointerType,
    AsyncSaveResponse,
    async_save,
)
from torch.distributed.distributed_c10d import _set_pg_timeout

from dcp_invariant.commit import after_save
from dcp_invariant.errors import AppRaised, FixtureError
from dcp_invariant.plan import AppShape
from dcp_invariant.ranks import app_objects, checkpointing, digest, state_keys
from dcp_invariant.ranks.tasks import load_through_pointer
from dcp_invariant.suite.fixture import (
    Anchored,
    broken_interface,
    build_app,
    checked_loss,
    checked_state,
    loss_value,
)
from dcp_invariant.suite.scenarios.payloads import (
    FixtureLoadCut,
    FixtureNeverSaves,
    FixtureProbe,
    FixtureProbeRecord,
    FixtureResume,
    FixtureTrain,
    ProbePhase,
)
from dcp_invariant.suite.worker import Reporter, loopback_gloo_options


def fixture_probe(rank: int, world_size: int, payload: FixtureProbe, report: Reporter) -> None:
    """Check the fixture's interface before any scenario runs: a problem here is bad input.

    Problems with the module or with what the fixture returns are reported as ``problem``: a
    module that cannot be imported, state DCP cannot save (checked before and after the first
    step, which is when an optimizer makes its state). An exception raised by the fixture's own
    code propagates, so its traceback reaches the log.
    """
    spec = payload["fixture"]
    shape: AppShape | None = None  # who checkpoints the app, once it is built

    def probed(
        phase: ProbePhase, problem: str | None = None, threads: list[str] | None = None
    ) -> None:
        """Report the probe as it stands: what it found of the app so far, and ``phase``."""
        record: FixtureProbeRecord = {
            "problem": problem,
            "phase": phase,
            "threads": threads or [],
            "shape": shape,
        }
        report(dict(record))

    def entering(phase: ProbePhase) -> None:
        # Each phase is recorded as it starts: a probe that times out is then reported by the
        # phase it was stuck in (runner._probe_timeout).
        probed(phase)

    try:
        entering("build")
        app = build_app(spec, rank, world_size, payload["fixture_args"])
        shape = app.shape
        entering("state_dict")
        if app.has_state:
            _rank_local_present(spec, app.state_dict(), payload["rank_local"])
            _probe_state(spec, app.state_dict(), through_dcp=app.checkpointing == "dcp")
        entering("step")
        checked_loss(spec, app.step())
        entering("state_dict_after_step")
        if app.has_state:
            _probe_state(spec, app.state_dict(), through_dcp=app.checkpointing == "dcp")
    except (FixtureError, state_keys.StateKeyError) as exc:
        probed("done", problem=str(exc))
        return
    # The worker cannot exit while a thread that is not a daemon runs: CPython joins every one
    # at exit (threading._shutdown, which multiprocessing's Process._bootstrap calls too). The
    # ones running now are named, in case the exit is what times out.
    current = threading.current_thread()
    threads = [
        t.name for t in threading.enumerate() if t is not current and not t.daemon and t.is_alive()
    ]
    probed("done", threads=threads)


def _rank_local_present(spec: str, state: Any, components: list[str]) -> None:
    """Each component declared rank-local is a top-level key of ``state_dict()``."""
    have = sorted(map(str, checked_state(spec, state)))
    for name in components:
        if name not in have:
            raise FixtureError(
                f"--rank-local {name}: fixture {spec!r}'s state_dict() has no component "
                f"{name!r}; its components are {', '.join(have) or 'none'}"
            )


def _probe_state(spec: str, state: Any, *, through_dcp: bool) -> None:
    """``state`` can be recorded key by key and, where the tool saves it (``through_dcp``),
    saved and loaded by DCP."""
    problem = state_keys.refusal(checked_state(spec, state)) if through_dcp else None
    if problem is not None:
        raise FixtureError(f"fixture {spec!r}: state_dict() holds {problem}")
    for path, value in state_keys.gather(state).items():
        try:
            state_keys.record({path: value})
        except TypeError as exc:
            raise FixtureError(f"fixture {spec!r}: state_dict() holds {path}, {exc}") from None
        except (RuntimeError, NotImplementedError) as exc:
            # A tensor type this tool has not met (a subclass, say): named, never a traceback.
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise FixtureError(
                f"fixture {spec!r}: state_dict() holds {path}, a {type(value).__name__} "
                f"({state_keys.describe(value)}) whose bytes cannot be read ({first}); save it "
                "as a plain tensor and rebuild it in load_state_dict()"
            ) from None


def _loss(spec: str, app: Any) -> float:
    try:
        return loss_value(spec, app.step())
    except FixtureError as exc:
        broken_interface(str(exc))


def _stop_if_not_finite(loss: float, step: str) -> None:
    """After a non-finite loss is recorded: the run cannot go on meaningfully, so stop here.

    The recorded loss (``nan``, ``inf``) is what the verdict rests on (``non-finite loss`` in
    dcp_invariant/evidence/families/_fixture_arms.py); the exit code stops the scenario's later groups.
    """
    if not math.isfinite(loss):
        broken_interface(f"{step} returned {loss!r}, expected a finite float loss")


def fixture_train(rank: int, world_size: int, payload: FixtureTrain, report: Reporter) -> None:
    """Take N steps, save (through DCP, or the app's own save), then take K more: the
    uninterrupted arm (or a source).

    With ``async_mode`` the save is ``dcp.async_save``, and step N+1 runs while its write is
    held back, as a trainer's next step runs while the checkpoint uploads.
    """
    spec = payload["fixture"]
    n = payload["steps_before"]
    app = build_app(spec, rank, world_size, payload["fixture_args"])
    checkpointing.expect(app, payload["shape"])
    record: dict[str, Any] = {
        "losses_before": [],
        "objects": {"final": None, "saved": None},
        "rank": rank,
        "saved": None,
        "steps": [],
    }
    for step in range(1, n + 1):
        loss = _loss(spec, app)
        record["losses_before"].append(loss.hex())
        if not math.isfinite(loss):
            report(record)
            _stop_if_not_finite(loss, f"step {step}")
    mode = payload.get("async_mode")
    if mode is None:
        checkpointing.save(app, payload["checkpoint"])
    # The state at the save is what the checkpoint must hold, whatever comes after (an async
    # save's next step runs below).
    with digest.remembering():
        record["saved"] = _observe(spec, app, payload["snapshots"], rank, "saved")
        record["objects"]["saved"] = _objects(app, payload["objects"], payload["ignored_attrs"])
    if mode is not None:
        if mode == "app":
            record["async"] = _own_save_while_stepping(spec, app, payload, record, rank)
        else:
            record["async"] = _save_while_stepping(spec, app, payload, record, rank, mode)
    report(record)
    if record["steps"]:
        _stop_if_not_finite(float.fromhex(record["steps"][0]["loss"]), f"step {n + 1}")
    for step in range(len(record["steps"]) + 1, payload["steps_after"] + 1):
        loss = _loss(spec, app)
        with digest.remembering():
            keys = _observe(spec, app, payload["snapshots"], rank, f"step-{step}")
            if step == payload["steps_after"]:
                record["objects"]["final"] = _objects(
                    app, payload["objects"], payload["ignored_attrs"]
                )
        record["steps"].append({"keys": keys, "loss": loss.hex()})
        report(record)
        _stop_if_not_finite(loss, f"step {n + step}")
    if record["objects"]["final"] is None:  # no step after the async one's, or none at all
        record["objects"]["final"] = _objects(app, payload["objects"], payload["ignored_attrs"])
    report(record)


def fixture_never_saves(
    rank: int, world_size: int, payload: FixtureNeverSaves, report: Reporter
) -> None:
    """Take N+K steps without saving, and without reading ``state_dict()`` either: reading it
    is what a save does first, and it can change training (``get_state_dict`` steps an
    optimizer that has no state yet with zero gradients, ``_init_optim_state`` in
    torch/distributed/checkpoint/state_dict.py; pytorch#140898). Losses, and the app's own
    objects at step N and at the end (read by attribute, never through the app), are what
    the arms that save are held to."""
    spec = payload["fixture"]
    app = build_app(spec, rank, world_size, payload["fixture_args"])
    checkpointing.expect(app, payload["shape"])
    record: dict[str, Any] = {
        "losses_after": [],
        "losses_before": [],
        "objects": {"final": None, "saved": None},
        "rank": rank,
    }
    n, k = payload["steps_before"], payload["steps_after"]
    for step in range(1, n + k + 1):
        loss = _loss(spec, app)
        record["losses_before" if step <= n else "losses_after"].append(loss.hex())
        if step == n:
            with digest.remembering():
                record["objects"]["saved"] = _objects(app, True, payload["ignored_attrs"])
        if step == n + k:
            with digest.remembering():
                record["objects"]["final"] = _objects(app, True, payload["ignored_attrs"])
        report(record)
        _stop_if_not_finite(loss, f"step {step}")


def _objects(app: Anchored, wanted: bool, ignoring: list[str]) -> dict[str, str] | None:
    """The fingerprints of the user's app object (not of the tool's wrapper around it), where
    a later rule compares them, without the attributes the plan ignores (``--ignore-attr``)."""
    return app_objects.fingerprints(app.app, ignoring=ignoring) if wanted else None


class _GatedWriter(FileSystemWriter):  # type: ignore[misc]  # torch is Any to mypy (pyproject.toml)
    """Writes nothing until the gate file exists: the next step certainly overlaps the save."""

    def __init__(self, path: str, gate: Path, timeout: float) -> None:
        # The write runs in the background while the loop's next step runs, and that step may
        # change the working directory: the writer works on the absolute path, and records the
        # relative id in ``.metadata`` as a synchronous save does (the evidence holds no path).
        super().__init__(os.path.abspath(path))
        self._relative_id = Path(path)  # a Path, as FileSystemWriter keeps its own
        self._gate = gate.absolute()
        self._timeout = timeout

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self._relative_id, save_id=self.save_id)

    def write_data(self, plan: Any, planner: Any) -> Any:
        deadline = time.monotonic() + self._timeout
        while not self._gate.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the gate {self._gate.name} never opened")
            time.sleep(0.005)
        return super().write_data(plan, planner)


def stager(mode: str) -> Any:
    """The stager of an async save in ``mode``, looked up as the save starts.

    Looked up by name so that a fixture of the live tests, built in a worker, can put one in
    its place that stages nothing, and show that a write reading the tensors late is caught.
    """
    if mode == "staged":
        # Pinned and shared memory need an accelerator; this is a CPU run.
        return DefaultStager(StagingOptions(False, False, True, False))
    return None  # async_save's own default: a synchronous copy before it returns


def _loopback_store_for_checkpoint_process(group: Any, rank: int) -> None:
    """Give process mode's checkpoint processes a store that listens on 127.0.0.1 only.

    Left to itself, DCP's checkpoint process builds a TCPStore server on a free port, and a
    TCPStore server listens on every interface. With DCP_USE_PREFIX_STORE=1 it is a client of
    the store at MASTER_ADDR:MASTER_PORT instead (torch/distributed/checkpoint/
    _async_process_executor.py, _ProcessGroupInitInfo): rank 0 serves that store here, on a
    socket bound to loopback and handed over as ``master_listen_fd`` (Linux; elsewhere the
    store is bound as torch binds it).
    """
    global _CHECKPOINT_STORE
    server = None
    if rank == 0:
        listener = None
        if sys.platform == "linux":
            listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1] if listener is not None else 0
        options: dict[str, Any] = {"is_master": True, "wait_for_workers": False}
        if listener is not None:
            options["master_listen_fd"] = listener.detach()
        server = TCPStore("127.0.0.1", port, **options)
        _CHECKPOINT_STORE = server  # serves until this worker exits
    ports = [server.port if server is not None else 0]
    dist.broadcast_object_list(ports, src=0, group=group)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports[0]), DCP_USE_PREFIX_STORE="1")


_CHECKPOINT_STORE: Any = None


def _save_while_stepping(
    spec: str, app: Any, payload: FixtureTrain, record: dict[str, Any], rank: int, mode: str
) -> dict[str, Any]:
    """async_save, step N+1 while the write waits at the gate, then let it finish."""
    timeout = float(payload["timeout"])
    group = _checkpoint_group(timeout)
    # In the scenario's workspace, which exists already: the checkpoint's directory is made by
    # the write, in the background thread, and may not exist yet when the gate opens.
    gate = Path(f"{Path(payload['checkpoint']).name}.gate-rank{rank}")
    writer = _GatedWriter(payload["checkpoint"], gate, timeout)
    staging = stager(mode)
    kind = AsyncCheckpointerType.THREAD
    if mode == "process":
        if sys.platform != "win32":
            # Not on Windows: its torch is built without libuv, and any TCPStore made with the
            # binding's default use_libuv=True fails there ("use_libuv was requested but PyTorch
            # was built without libuv support", torch/csrc/distributed/c10d/TCPStore.cpp), as
            # torch's own client under DCP_USE_PREFIX_STORE=1 is
            # (torch/distributed/checkpoint/_async_process_executor.py). Without the prefix
            # store the checkpoint process rendezvouses through env://, which torch keeps off
            # libuv on Windows (_get_use_libuv_from_query_dict in
            # torch/distributed/rendezvous.py); its store then listens as torch binds it.
            _loopback_store_for_checkpoint_process(group, rank)
        kind = AsyncCheckpointerType.PROCESS
    response = async_save(
        {"app": app},
        storage_writer=writer,
        process_group=group,
        async_checkpointer_type=kind,
        async_stager=staging,
    )
    staged_first = isinstance(response, AsyncSaveResponse)
    if isinstance(response, AsyncSaveResponse):
        # The documented pattern: the next step waits for the staging, not for the upload.
        response.staging_completion.result(timeout=timeout)
        upload: Future[Any] = response.upload_completion
    else:
        upload = response
    try:
        loss = _loss(spec, app).hex()  # a non-finite one is recorded; the caller stops after it
        keys = _observe(spec, app, payload["snapshots"], rank, "step-1")
        pending = not upload.done()
    finally:
        gate.touch()  # a rank that stops here must not leave DCP's writer waiting at the gate
    error = None
    try:
        upload.result(timeout=timeout)
    # Recorded: a background save's failure must never be lost. DCP's own failure is a
    # CheckpointException, which derives from BaseException (torch/distributed/checkpoint/api.py).
    except (Exception, CheckpointException) as exc:
        error = f"{type(exc).__name__}: {exc}"
    record["steps"].append({"keys": keys, "loss": loss})
    if staging is not None:
        staging.close()
    dist.destroy_process_group(group)
    return {"pending_during_step": pending, "staged_first": staged_first, "upload_error": error}


# Gloo waits this many times a group's timeout for a pair's first connection (Pair::waitUntil,
# gloo/transport/tcp/pair.h: "Use a longer timeout when waiting for initial connect").
_GLOO_CONNECT_FACTOR = 5


def _checkpoint_group(timeout: float) -> dist.ProcessGroup:
    """A Gloo group of its own for the checkpoint's collectives, which run in DCP's background
    thread: on the training group they could interleave with the step's all-reduces (torchtitan's
    async checkpointing gives them a group too). A rank whose peer is lost while it is made
    fails within ``timeout``.

    new_group's default timeout is 30 minutes (default_pg_timeout,
    torch/distributed/distributed_c10d.py), and the side of a Gloo pair that listens for the
    connection has no timeout of its own (``connectAsListener``, gloo/transport/tcp/device.cc):
    it waits five times the group's. An in-job rank whose node was lost as the group connected
    waited 316 s under ``--timeout 60`` (measured). So the ranks first meet on the training
    group, under the run's timeout, and the group is made with a fifth of it, which then bounds
    only its store exchange and connection (a few milliseconds once every rank is there). Its
    collectives get the whole timeout back (``_set_pg_timeout``, as torchtitan's
    ``set_pg_timeouts`` does). ``pg_options`` is passed for a torch that hands it on to Gloo
    (:func:`loopback_gloo_options`).
    """
    dist.barrier()
    made_within = max(timeout / _GLOO_CONNECT_FACTOR, min(timeout, 5.0))
    group = dist.new_group(
        backend="gloo", pg_options=loopback_gloo_options(), timeout=timedelta(seconds=made_within)
    )
    assert group is not None  # every rank is a member
    _set_pg_timeout(timedelta(seconds=timeout), group)
    return group


def _own_save_while_stepping(
    spec: str, app: Anchored, payload: FixtureTrain, record: dict[str, Any], rank: int
) -> dict[str, Any]:
    """The app's own async save: its save() returns, step N+1 runs, then its future is waited
    for. Whether the write was still running during the step is the app's timing, not the
    tool's (it cannot hold a framework's writer back as it does DCP's), so it is not recorded:
    two runs would differ."""
    pending = checkpointing.start(app, payload["checkpoint"])
    loss = _loss(spec, app).hex()  # a non-finite one is recorded; the caller stops after it
    keys = _observe(spec, app, payload["snapshots"], rank, "step-1")
    error = None
    try:
        checkpointing.finish(pending)
    except AppRaised as exc:
        # One line for the log: the type is the evidence (the message may hold paths).
        print(f"the app's async save failed: {exc}", flush=True)
        error = type(exc.error).__name__
    else:
        # What the save wrote as its future completed: the commit refuses what changes after.
        after_save.record(payload["checkpoint"], rank)
    record["steps"].append({"keys": keys, "loss": loss})
    return {"pending_during_step": None, "staged_first": False, "upload_error": error}


def fixture_resume(rank: int, world_size: int, payload: FixtureResume, report: Reporter) -> None:
    """Load through the pointer into a fresh app, compare with the reference, take K steps."""
    spec = payload["fixture"]
    app = build_app(spec, rank, world_size, payload["fixture_args"])
    checkpointing.expect(app, payload["shape"])
    left_out = payload["rank_local"]
    loadable = _WithoutComponents(app, left_out) if left_out else None
    record = load_through_pointer(
        payload["store"], checkpointing.loader(app, loadable), rank, record_load_error=True
    )
    record.update(loaded=None, steps=[], diffs=[], objects={"final": None, "loaded": None})
    record.setdefault("load_error", None)
    if not record["verified_before_load"] or record["load_error"] is not None:
        report(record)
        return
    reference = Path(payload["reference"])
    # The rank whose saved state this rank must hold: itself, or for a reshard from fewer ranks
    # the one it takes the place of (replicated values are the same on every source rank).
    source_rank = rank % payload["source_world_size"]
    # The objects after state_dict() was read, as the arms' are after theirs: a lazy
    # initialisation it does (FSDP's, say) is then on both sides.
    with digest.remembering():
        record["loaded"] = _compare(
            spec, app, reference, source_rank, "saved", "loaded", record["diffs"]
        )
        record["objects"]["loaded"] = _objects(app, payload["objects"], payload["ignored_attrs"])
    report(record)
    for step in range(1, payload["steps_after"] + 1):
        loss = _loss(spec, app)
        phase = f"step-{step}"
        with digest.remembering():
            if payload["compare_steps"]:
                keys = _compare(spec, app, reference, source_rank, phase, phase, record["diffs"])
            else:
                keys = state_keys.record(_leaves(spec, app))
            if step == payload["steps_after"]:
                record["objects"]["final"] = _objects(
                    app, payload["objects"], payload["ignored_attrs"]
                )
        record["steps"].append({"keys": keys, "loss": loss.hex()})
        report(record)
        _stop_if_not_finite(loss, f"resumed step {step}")
    report(record)


def fixture_load_cut(rank: int, world_size: int, payload: FixtureLoadCut, report: Reporter) -> None:
    """Point a fresh app's own load() at a checkpoint cut short: does it refuse it?"""
    app = build_app(payload["fixture"], rank, world_size, payload["fixture_args"])
    checkpointing.expect(app, payload["shape"])
    record: dict[str, Any] = {"rank": rank, "loaded": False, "exception": None}
    try:
        checkpointing.loader(app)(payload["directory"])
    except AppRaised as exc:  # the refusal this scenario hopes for, whatever its type
        if exc.method != "load":
            raise  # the fixture, or a state_dict() its load() called: not a refusal
        # One line for the log: the type is the evidence (the message may hold paths).
        print(f"load() refused the checkpoint cut short: {exc}", flush=True)
        record["exception"] = type(exc.error).__name__
    else:
        record["loaded"] = True
    report(record)


class _WithoutComponents:
    """The app as a reshard loads it: its rank-local components left out of what DCP reads.

    DCP asks ``state_dict()`` for what to load and fills it in place; the components left out
    are handed back to ``load_state_dict`` as the fresh app built them, so each rank keeps its
    own, as a data loader keyed by rank must when the world size changes (torchtitan issue
    #811, PR #816).
    """

    def __init__(self, app: Any, components: list[str]) -> None:
        self._app = app
        self._components = set(components)

    def state_dict(self) -> dict[str, Any]:
        state = self._app.state_dict()
        return {k: v for k, v in state.items() if k not in self._components}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        own = self._app.state_dict()
        self._app.load_state_dict(
            {k: own[k] if k in self._components else state_dict[k] for k in own}
        )


def _leaves(spec: str, app: Anchored) -> dict[str, Any]:
    """The app's state by key, global values; what the probe refused, refused again here.

    The probe saw the state before and after one step only: what DCP cannot save, or this tool
    cannot hash, if it appears later, ends the rank with one line instead of a traceback of
    this tool's frames. An app that saves itself and has no ``state_dict()`` has no keys: its
    resume is judged by its losses and its own objects (:mod:`..app_objects`).
    """
    if not app.has_state:
        return {}
    try:
        state = checked_state(spec, app.state_dict())
        problem = state_keys.refusal(state) if app.checkpointing == "dcp" else None
        if problem is not None:
            broken_interface(f"state_dict() holds {problem}")
        return state_keys.gather(state)
    except (FixtureError, state_keys.StateKeyError) as exc:
        broken_interface(str(exc))


def _record(leaves: dict[str, Any]) -> dict[str, str]:
    try:
        return state_keys.record(leaves)
    except TypeError as exc:
        broken_interface(f"state_dict() holds {exc}")


def _observe(spec: str, app: Any, snapshots: str | None, rank: int, phase: str) -> dict[str, str]:
    """The records of this phase, and its snapshot unless no later group will read one."""
    leaves = _leaves(spec, app)
    keys = _record(leaves)
    if snapshots is not None:
        state_keys.save_snapshot(leaves, keys, _snapshot_path(Path(snapshots), rank, phase))
    return keys


def _compare(
    spec: str,
    app: Any,
    reference: Path,
    source_rank: int,
    reference_phase: str,
    phase: str,
    diffs: list[dict[str, Any]],
) -> dict[str, str]:
    leaves = _leaves(spec, app)
    keys = _record(leaves)
    path = _snapshot_path(reference, source_rank, reference_phase)
    if path.exists():
        diffs += state_keys.differences(state_keys.load_snapshot(path), keys, leaves, phase)
    return keys


def _snapshot_path(directory: Path, rank: int, phase: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"rank{rank}-{phase}.json"
