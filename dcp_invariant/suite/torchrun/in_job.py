"""``torchrun ... -m dcp_invariant in-job --fixture MOD:FN --checkpoint-dir DIR --output-dir DIR``:
the checks inside the user's own torchrun job, on every node, at the world size it trains at.

torchrun starts, restarts and stops this program on every node; it starts no process of its
own. Each scenario of :func:`dcp_invariant.plan.in_job_plan` works in its own directory under
``--checkpoint-dir``, which every node must see (a shared filesystem):

- attempt 0 (``TORCHELASTIC_RESTART_COUNT`` 0): the uninterrupted arm takes N steps, saves
  through DCP (``dcp.save``, or ``dcp.async_save`` in thread mode while step N+1 runs) and takes
  K more; a second arm repeats it, so a loop that does not repeat itself is named as such. Once
  every rank's save has returned, rank 0 seals and promotes the first arm's checkpoint. Every
  rank writes what it saw beside it and exits with :data:`plan.ELASTIC_EXIT_CODE`, so torchrun
  restarts every worker on every node;
- attempt 1: each fresh worker loads through the pointer, verifies the receipt before and
  after, compares what it loaded with what was saved, and takes the K steps against the
  uninterrupted arm's, bit for bit. Rank 0 gathers every rank's records, judges them with the
  rules ``verify`` applies, and writes the artifact.

With ``--resume-from`` (the first launch's ``--checkpoint-dir``), a second launch at another
world size runs ``reshard_<a>_to_<W>`` instead, without a restart: its workers load the first
launch's committed ``resume_<a>`` generation, every key must equal what its source rank saved
(DTensors by global value), and K steps follow.

The process group meets through a file under ``--checkpoint-dir`` (torch's ``FileStore``), not
a TCP store: the only sockets are the backend's own, on the interface the user names
(``GLOO_SOCKET_IFNAME``; loopback is no option across hosts).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from dcp_invariant import canonical, plan, regular_file, runtimes
from dcp_invariant.commit import CheckpointStore, durable
from dcp_invariant.errors import InJobError
from dcp_invariant.evidence.families.records import GroupRecord
from dcp_invariant.suite.scenarios.commits import Interner, commit
from dcp_invariant.suite.scenarios.common import REFERENCE_SNAPSHOTS, STORE_ROOT
from dcp_invariant.suite.scenarios.payloads import FixtureResume, FixtureTrain

# Under --checkpoint-dir: the process group's files, and each rank's records between attempts.
STATE_DIR = ".in-job"
COMMIT_FILE = "commit.json"


@dataclass(frozen=True)
class Options:
    fixture: str
    checkpoint_dir: Path
    output_dir: Path
    steps_before: int
    steps_after: int
    fixture_args: Mapping[str, Any]
    backend: plan.Backend
    gloo_interface: str | None
    timeout: float
    source_revision: str
    resume_from: Path | None = None


@dataclass(frozen=True)
class JobEnvironment:
    """What torchrun tells each worker (torch/distributed/run.py sets these)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    restart_count: int
    max_restarts: int

    @classmethod
    def read(cls, environ: Mapping[str, str]) -> JobEnvironment:
        names = (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS",
        )
        missing = [n for n in names if not environ.get(n, "").isdigit()]
        if missing:
            raise InJobError(
                f"in-job runs as a torchrun worker, and {', '.join(missing)} is not set: launch it "
                "with torchrun --max-restarts=1 ... -m dcp_invariant in-job ..."
            )
        job = cls(*(int(environ[n]) for n in names))
        if job.world_size % job.local_world_size:
            raise InJobError(
                f"WORLD_SIZE {job.world_size} is not a multiple of LOCAL_WORLD_SIZE "
                f"{job.local_world_size}: give every node the same --nproc-per-node"
            )
        return job

    def expect_one_restart(self) -> None:
        if self.max_restarts != 1:
            raise InJobError(
                f"torchrun allows {self.max_restarts} restarts: launch it with --max-restarts=1, "
                "the one restart the check makes"
            )
        if self.restart_count > 1:
            raise InJobError(
                f"this is torchrun's restart {self.restart_count}; the check makes exactly one"
            )

    def expect_no_restart(self) -> None:
        if self.restart_count:
            raise InJobError(
                "torchrun restarted the workers of a resumed check, which makes no restart: "
                "see the first attempt's log"
            )

    @property
    def nodes(self) -> int:
        return self.world_size // self.local_world_size


def run_id(environ: Mapping[str, str]) -> str:
    """torchrun's --rdzv-id, kept to a safe file-name part: it names this launch's files."""
    given = environ.get("TORCHELASTIC_RUN_ID", "none")
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in given)[:64] or "none"


def device_for(backend: plan.Backend, local_rank: int, cuda_devices: int) -> str:
    """The device each rank's app and collectives use: NCCL needs the rank's own GPU."""
    if backend == "gloo":
        return "cpu"
    if local_rank >= cuda_devices:
        raise InJobError(
            f"backend nccl: local rank {local_rank} has no CUDA device (this node has "
            f"{cuda_devices}); use --backend gloo, or as many processes per node as GPUs"
        )
    return f"cuda:{local_rank}"


def first_launch(resume_from: Path) -> tuple[int, Path]:
    """The world size the first launch saved at, and its ``resume_<a>`` directory."""
    found = sorted(
        p
        for p in resume_from.glob("resume_*")
        if p.name.removeprefix("resume_").isdigit() and (p / STATE_DIR / COMMIT_FILE).is_file()
    )
    if len(found) != 1:
        raise InJobError(
            f"--resume-from {resume_from} holds {len(found)} committed first launches "
            f"(resume_<W>/{STATE_DIR}/{COMMIT_FILE}); give the --checkpoint-dir of one "
            "in-job launch that finished"
        )
    return int(found[0].name.removeprefix("resume_")), found[0]


def the_plan(options: Options, job: JobEnvironment, resumed_from: int | None = None) -> plan.Plan:
    launch = plan.Launch(job.nodes, job.local_world_size, options.backend, resumed_from)
    return plan.in_job_plan(
        options.fixture, launch, options.steps_before, options.steps_after, options.fixture_args
    )


def main(options: Options) -> int:
    """One worker's part; its exit code is what torchrun sees."""
    from dcp_invariant.suite import fixture, output_dir, worker

    worker.die_with_parent()  # an agent SIGKILLed takes its workers with it
    job = JobEnvironment.read(os.environ)
    source: Path | None = None
    if options.resume_from is None:
        job.expect_one_restart()
        run_plan = the_plan(options, job)
    else:
        job.expect_no_restart()
        resumed_from, source = first_launch(options.resume_from.resolve())
        run_plan = the_plan(options, job, resumed_from)
    # Before any collective: bad input is found by every rank alike, and said once.
    fixture.load_fixture(options.fixture, options.fixture_args)
    root = options.checkpoint_dir.resolve()
    launch_id = run_id(os.environ)
    refused = root / STATE_DIR / f"refused-{launch_id}"
    if job.restart_count == 0:
        output_dir.check_target(options.output_dir)
        # Before the process group: no rank of this launch has created anything yet.
        earlier = [s.name for s in run_plan.scenarios if (root / s.name).exists()]
        if earlier:
            # The restart that follows must not judge that earlier run's records as this one's.
            refused.parent.mkdir(parents=True, exist_ok=True)
            refused.touch()
            raise InJobError(
                f"{root} holds an earlier run's {', '.join(earlier)}: give a fresh --checkpoint-dir"
            )
    elif refused.exists():
        raise InJobError(f"the first attempt refused {root}: give a fresh --checkpoint-dir")
    if options.gloo_interface:
        os.environ["GLOO_SOCKET_IFNAME"] = options.gloo_interface

    import torch
    import torch.distributed as dist
    from torch._C._distributed_c10d import FileStore

    distribution, runtime = importlib.metadata.version("torch"), str(torch.__version__)
    runtimes.require(distribution, runtime)
    device = device_for(options.backend, job.local_rank, torch.cuda.device_count())
    if device != "cpu":
        torch.cuda.set_device(device)
    (root / STATE_DIR).mkdir(parents=True, exist_ok=True)
    pg_file = root / STATE_DIR / f"pg-{launch_id}-attempt{job.restart_count}"
    store = FileStore(str(pg_file), job.world_size)
    dist.init_process_group(
        options.backend,
        store=store,
        rank=job.rank,
        world_size=job.world_size,
        timeout=timedelta(seconds=options.timeout),
    )
    try:
        if source is not None:
            return _resharded(root, source, run_plan, job, options, distribution, runtime)
        if job.restart_count == 0:
            _first_attempt(root, run_plan, job, options)
            return plan.ELASTIC_EXIT_CODE
        return _after_restart(root, run_plan, job, options, distribution, runtime)
    finally:
        dist.destroy_process_group()


def _first_attempt(root: Path, run_plan: plan.Plan, job: JobEnvironment, options: Options) -> None:
    import torch.distributed as dist

    label = run_plan.baseline_label
    for scenario in run_plan.scenarios:
        workdir = root / scenario.name
        (workdir / STATE_DIR).mkdir(parents=True, exist_ok=True)
        os.chdir(workdir)
        arms = {}
        for arm, candidate, snapshots in (
            ("reference", label, REFERENCE_SNAPSHOTS),
            ("repeat", f"repeat-{label}", None),
        ):
            payload: FixtureTrain = {
                "checkpoint": f"{STORE_ROOT}/candidates/{candidate}",
                "fixture": options.fixture,
                "fixture_args": dict(options.fixture_args),
                "snapshots": snapshots,
                "steps_after": run_plan.steps_after,
                "steps_before": run_plan.steps_before,
            }
            if scenario.async_mode:
                payload["async_mode"] = scenario.async_mode
                payload["timeout"] = options.timeout
            arms[arm] = _task("fixture_train", job, payload)
            dist.barrier()  # every rank's save has returned: its files are durable
        store = CheckpointStore(workdir / STORE_ROOT)
        if job.rank == 0:
            interner = Interner()
            record = commit(store, label, interner)
            done = {"commit": record, "met": interner.met, "pointer": _digest(store)}
            durable.replace_file(workdir / STATE_DIR / COMMIT_FILE, canonical.dumps(done))
        dist.barrier()
        # Every rank must see the pointer rank 0 moved: a shared filesystem that shows one node
        # an older pointer would have that node resume from another generation.
        arms["pointer_seen"] = _digest(store) == _read(workdir / STATE_DIR / COMMIT_FILE)["pointer"]
        mine = workdir / STATE_DIR / f"attempt0-rank{job.rank}.json"
        durable.replace_file(mine, canonical.dumps(arms))
        dist.barrier()
        os.chdir(root)


def _after_restart(
    root: Path,
    run_plan: plan.Plan,
    job: JobEnvironment,
    options: Options,
    distribution: str,
    runtime: str,
) -> int:
    import torch.distributed as dist

    observations: dict[str, dict[str, Any]] = {}
    for scenario in run_plan.scenarios:
        workdir = root / scenario.name
        os.chdir(workdir)
        payload: FixtureResume = {
            "compare_steps": True,
            "fixture": options.fixture,
            "fixture_args": dict(options.fixture_args),
            "rank_local": [],
            "reference": REFERENCE_SNAPSHOTS,
            "source_world_size": job.world_size,
            "steps_after": run_plan.steps_after,
            "store": STORE_ROOT,
        }
        target = _task("fixture_resume", job, payload)
        first = _read(workdir / STATE_DIR / f"attempt0-rank{job.rank}.json")
        gathered: list[Any] = [None] * job.world_size if job.rank == 0 else []
        dist.gather_object(
            {"arms": first, "target": target}, gathered if job.rank == 0 else None, dst=0
        )
        if job.rank == 0:
            committed = _read(workdir / STATE_DIR / COMMIT_FILE)
            observations[scenario.name] = observation(scenario, run_plan, gathered, committed)
        os.chdir(root)
    verdict = [0]
    if job.rank == 0:
        verdict[0] = _write_artifact(observations, run_plan, options, distribution, runtime)
    dist.broadcast_object_list(verdict, src=0)
    return int(verdict[0])


def _resharded(
    root: Path,
    source: Path,
    run_plan: plan.Plan,
    job: JobEnvironment,
    options: Options,
    distribution: str,
    runtime: str,
) -> int:
    """A second launch: load the first launch's committed checkpoint at this world size."""
    import torch.distributed as dist

    [scenario] = run_plan.scenarios
    workdir = root / scenario.name
    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)
    payload: FixtureResume = {
        "compare_steps": False,
        "fixture": options.fixture,
        "fixture_args": dict(options.fixture_args),
        "rank_local": [],
        "reference": str(source / REFERENCE_SNAPSHOTS),
        "source_world_size": scenario.source_world_size,
        "steps_after": run_plan.steps_after,
        "store": str(source / STORE_ROOT),
    }
    target = _task("fixture_resume", job, payload)
    gathered: list[Any] = [None] * job.world_size if job.rank == 0 else []
    dist.gather_object(target, gathered if job.rank == 0 else None, dst=0)
    os.chdir(root)
    verdict = [0]
    if job.rank == 0:
        committed = _read(source / STATE_DIR / COMMIT_FILE)
        arms = [
            _read(source / STATE_DIR / f"attempt0-rank{r}.json")
            for r in range(scenario.source_world_size)
        ]
        observations = {
            scenario.name: resharded_observation(scenario, run_plan, arms, gathered, committed)
        }
        verdict[0] = _write_artifact(observations, run_plan, options, distribution, runtime)
    dist.broadcast_object_list(verdict, src=0)
    return int(verdict[0])


TaskResult = dict[str, Any]  # {"exit_code": 0 or 1, "record": the rank's report or None}


def _task(name: str, job: JobEnvironment, payload: Any) -> TaskResult:
    """Run a fixture task on this rank as a worker of the pool would, catching what it raises."""
    from dcp_invariant.ranks import fixture_tasks

    fn: Callable[..., None] = getattr(fixture_tasks, name)
    reported: list[dict[str, Any]] = []
    try:
        fn(job.rank, job.world_size, payload, reported.append)
    except Exception as exc:
        # The user wants their loop's frames: print them, and record the rank's failure.
        traceback.print_exception(exc, file=sys.stderr)
        return {"exit_code": 1, "record": reported[-1] if reported else None}
    return {"exit_code": 0, "record": reported[-1] if reported else None}


def _digest(store: CheckpointStore) -> str | None:
    raw = store.pointer_bytes()
    return None if raw is None else hashlib.sha256(raw).hexdigest()


def _read(path: Path) -> Any:
    try:
        return canonical.loads(regular_file.read(path, bound=durable.MAX_RECORD_BYTES))
    except FileNotFoundError:
        raise InJobError(
            f"{path} is missing: the first attempt did not finish on every rank (see its log)"
        ) from None


def group(results: list[TaskResult]) -> GroupRecord:
    """The group record the pool would have made of these ranks' results, in rank order."""
    return {
        "exit_codes": [r["exit_code"] for r in results],
        "timed_out": False,
        "ranks": [r["record"] for r in results if r["record"] is not None],
    }


def observation(
    scenario: plan.Scenario,
    run_plan: plan.Plan,
    gathered: list[dict[str, Any]],
    committed: dict[str, Any],
) -> dict[str, Any]:
    """The scenario's observation, in the shape its family's driver gives it on one host
    (``run`` in dcp_invariant/suite/scenarios/resume.py), so ``verify`` holds it to the same
    rules."""
    fields: dict[str, Any] = {"save_mode": scenario.async_mode} if scenario.async_mode else {}
    errors = [
        f"rank {rank}: after the commit it read another pointer than the one rank 0 moved: "
        "the shared filesystem does not show every node the same files"
        for rank, g in enumerate(gathered)
        if not g["arms"]["pointer_seen"]
    ]
    return {
        **_common(scenario, run_plan, [g["target"] for g in gathered], committed),
        "errors": errors,
        "reference": group([g["arms"]["reference"] for g in gathered]),
        "repeat": group([g["arms"]["repeat"] for g in gathered]),
        **fields,
    }


def resharded_observation(
    scenario: plan.Scenario,
    run_plan: plan.Plan,
    arms: list[dict[str, Any]],
    targets: list[TaskResult],
    committed: dict[str, Any],
) -> dict[str, Any]:
    """``reshard_<a>_to_<W>`` as its driver gives it on one host (``run`` in
    dcp_invariant/suite/scenarios/reshard.py). Its source is the first launch's uninterrupted
    arm up to the save: the N steps and the state saved; the K steps that arm took after the
    save were judged in the first launch's own artifact, so they are not the source's here."""
    source = group([arm["reference"] for arm in arms])
    source["ranks"] = [{**rank, "steps": []} for rank in source["ranks"]]
    return {
        **_common(scenario, run_plan, targets, committed),
        "source": source,
        "left_out": [],
    }


def _common(
    scenario: plan.Scenario,
    run_plan: plan.Plan,
    targets: list[TaskResult],
    committed: dict[str, Any],
) -> dict[str, Any]:
    """The fields every in-job observation has; the loading ranks' generations labelled after
    the commit's digests, in the order the driver on one host meets them."""
    intern = Interner.replayed([(kind, digest) for kind, digest in committed["met"]])
    target = group(targets)
    target["ranks"] = [
        {**r, "generation": intern("receipt", r["generation"])} for r in target["ranks"]
    ]
    return {
        "errors": [],
        "scenario": scenario.name,
        "schema_version": _schema_version(run_plan),
        "source_world_size": scenario.source_world_size,
        "target_world_size": scenario.target_world_size,
        "fixture": run_plan.fixture,
        "steps_before_save": run_plan.steps_before,
        "steps_after": run_plan.steps_after,
        "commit": committed["commit"],
        "target": target,
        "left_running": [],  # this program starts none: torchrun owns every process
    }


def _schema_version(run_plan: plan.Plan) -> int:
    from dcp_invariant.evidence import schema

    return schema.version_for(run_plan)


def _write_artifact(
    observations: dict[str, dict[str, Any]],
    run_plan: plan.Plan,
    options: Options,
    distribution: str,
    runtime: str,
) -> int:
    """Rank 0: judge, write the artifact, print the verdicts; 0 pass, 1 fail."""
    from dcp_invariant import python_api
    from dcp_invariant.evidence import provenance
    from dcp_invariant.suite import output_dir

    try:
        import numpy

        numpy_version: str | None = numpy.__version__
    except ImportError:
        numpy_version = None
    record = provenance.build(
        source_revision=options.source_revision,
        torch_distribution=distribution,
        torch_runtime=runtime,
        numpy=numpy_version,
        run_plan=run_plan,
    )
    reservation = output_dir.Reservation(options.output_dir)
    try:
        report = python_api.finish(observations, record, run_plan, reservation)
    finally:
        reservation.release()
    for result in report.results.values():
        print(f"{result.verdict:<4}  {result.name}", flush=True)
        for reason in result.reasons:
            print(f"      - {reason}", flush=True)
    print(report.summary, flush=True)
    return 0 if report.passed else 1
