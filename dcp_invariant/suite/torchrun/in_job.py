"""``torchrun ... -m dcp_invariant in-job --fixture MOD:FN --checkpoint-dir DIR --output-dir DIR``:
the checks inside the user's own torchrun job, on every node, at the world size it trains at.

torchrun starts, restarts and stops this program on every node; it starts no process of its
own. Each scenario of :func:`dcp_invariant.plan.in_job_plan` works in its own directory under
``--checkpoint-dir``, which every node must see (a shared filesystem). Its driver is the one
``run`` uses on this machine (:mod:`dcp_invariant.suite.scenarios`); here every worker is one
rank of each of its groups (:mod:`.host`):

- attempt 0 (``TORCHELASTIC_RESTART_COUNT`` 0): the uninterrupted arm takes N steps, saves
  through DCP (``dcp.save``, or ``dcp.async_save`` in thread mode while step N+1 runs), or
  with the app's own ``save`` where it has one (then ``resume_W`` alone runs), and takes K
  more; a second arm repeats it, so a loop that does not repeat itself is named as such. Once
  every rank's save has returned, rank 0 seals and promotes the first arm's checkpoint. At the
  driver's restart every rank writes what it recorded beside it and exits with
  :data:`plan.ELASTIC_EXIT_CODE`, so torchrun restarts every worker on every node;
- attempt 1: each fresh worker runs the driver again, handed back attempt 0's records up to the
  restart; then it loads through the pointer, verifies the receipt before and after, compares
  what it loaded with what was saved, and takes the K steps against the uninterrupted arm's,
  bit for bit. Every rank holds every rank's records; rank 0 judges them with the rules
  ``verify`` applies, and writes the artifact.

With ``--resume-from`` (the first launch's ``--checkpoint-dir``), a second launch at another
world size runs ``reshard_<a>_to_<W>`` instead, without a restart: its source is the first
launch's ``resume_<a>`` arm up to its save, and its commit; its workers load that committed
generation, every key must equal what its source rank saved (DTensors by global value), and K
steps follow.

The process group meets through a file under ``--checkpoint-dir`` (torch's ``FileStore``), not
a TCP store: the only sockets are the backend's own, on the interface the user names
(``GLOO_SOCKET_IFNAME``; loopback is no option across hosts).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from dcp_invariant import canonical, plan, regular_file, runtimes
from dcp_invariant.commit import durable
from dcp_invariant.errors import InJobError
from dcp_invariant.suite.scenarios import DRIVERS
from dcp_invariant.suite.scenarios.common import ScenarioContext
from dcp_invariant.suite.torchrun import host

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
    ignored_attrs: tuple[str, ...] = ()


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
        options.fixture,
        launch,
        options.steps_before,
        options.steps_after,
        options.fixture_args,
        ignored_attrs=options.ignored_attrs,
    )


def main(options: Options) -> int:
    """One worker's part; its exit code is what torchrun sees."""
    from dcp_invariant.suite import fixture, output_dir, worker

    worker.die_with_parent()  # an agent SIGKILLed takes its workers with it
    fixture.take_interrupts()  # a Ctrl-C stops the rank; a KeyboardInterrupt of the loop's is named
    job = JobEnvironment.read(os.environ)
    source: Path | None = None
    if options.resume_from is None:
        job.expect_one_restart()
        run_plan = the_plan(options, job)
    else:
        job.expect_no_restart()
        resumed_from, source = first_launch(options.resume_from.resolve())
        run_plan = the_plan(options, job, resumed_from)
    # Before any collective, and on every attempt alike: bad input is found by every rank, and
    # torchrun's restart meets the same refusal, not the first attempt's missing records.
    fixture.load_fixture(options.fixture, options.fixture_args)
    output_dir.check_target(options.output_dir)
    root = options.checkpoint_dir.resolve()
    launch_id = run_id(os.environ)
    refused = root / STATE_DIR / f"refused-{launch_id}"
    if job.restart_count == 0:
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
        run_plan = run_plan.checkpointed_by(_shape(options, job, root))
        return _run(root, run_plan, job, options, source, (distribution, runtime))
    finally:
        dist.destroy_process_group()


def _shape(options: Options, job: JobEnvironment, root: Path) -> plan.AppShape:
    """Who saves the app, whether it has a state_dict() to compare, and what it declares: the
    plan's scenarios hang on it, and a job has no probe (``run``'s runs in a worker of its own),
    so every rank builds the app once, in a directory of its own, before any scenario; every
    attempt alike, so that attempt 1 replays attempt 0's plan. Ranks whose apps differ would
    run different scenarios: every rank refuses that alike."""
    import torch.distributed as dist

    from dcp_invariant.suite import fixture

    scratch = root / STATE_DIR / f"shape-rank{job.rank}"
    scratch.mkdir(parents=True, exist_ok=True)
    home = os.getcwd()
    os.chdir(scratch)  # whatever the fixture writes where it runs
    try:
        app = fixture.build_app(options.fixture, job.rank, job.world_size, options.fixture_args)
    finally:
        os.chdir(home)
        # Only its shape is kept: the app built here is not used again, and a job refused from
        # here on (apps that differ by rank) leaves nothing of it.
        shutil.rmtree(scratch, ignore_errors=True)
    shapes: list[Any] = [None] * job.world_size
    dist.all_gather_object(shapes, app.shape)
    for rank, shape in enumerate(shapes):
        if shape != shapes[0]:
            raise InJobError(
                f"the app built on rank {rank} is {plan.described(shape)}, the one on rank 0 "
                f"{plan.described(shapes[0])}: build the same kind of app on every rank"
            )
    found: plan.AppShape = shapes[0]
    return found


def _run(
    root: Path,
    run_plan: plan.Plan,
    job: JobEnvironment,
    options: Options,
    source: Path | None,
    versions: tuple[str, str],
) -> int:
    """Each scenario's driver on this rank (:mod:`.host`): on attempt 0 up to its restart, the
    records kept, then :data:`plan.ELASTIC_EXIT_CODE`; after torchrun's restart, or in a second
    launch, whole, and rank 0 writes the artifact."""
    import torch.distributed as dist

    recording = source is None and job.restart_count == 0
    observations: dict[str, dict[str, Any]] = {}
    for scenario in run_plan.scenarios:
        workdir = root / scenario.name
        state = workdir / STATE_DIR
        mine = state / _records(job.rank)
        if source is not None:
            workdir.mkdir(parents=True, exist_ok=True)
            replay = host.resharded(host.entries(_read(source / STATE_DIR / _records(0))))
        elif recording:
            state.mkdir(parents=True, exist_ok=True)
            replay = None
        else:
            replay = host.entries(_read(mine))
        on_rank = host.TorchrunHost(
            job.rank, job.world_size, options.timeout, state / COMMIT_FILE, replay, source
        )
        ctx = ScenarioContext(scenario, on_rank, workdir, run_plan.fixture, run_plan)
        os.chdir(workdir)  # where the user's loop runs, and the checkpoint ids are relative to
        try:
            observations[scenario.name] = ctx.finished(DRIVERS[scenario.family](ctx))
        except host.Restarting:
            pass
        finally:
            os.chdir(root)
        if recording:
            durable.replace_file(mine, canonical.dumps(on_rank.recorded))
            dist.barrier()  # every rank's records are on disk before any worker exits
    if recording:
        # Every rank leaves right after that barrier, without finalizing torch (about 1.8 s,
        # and not alike on every node). An agent whose workers are still alive when another
        # node's agent joins the next rendezvous restarts them as a membership change, which
        # "do[es] not count as retries" (SimpleElasticAgent._invoke_run,
        # torch/distributed/elastic/agent/server/api.py): they would start again with
        # TORCHELASTIC_RESTART_COUNT 0, find this attempt's directories and refuse them as an
        # earlier run's (seen once in a loaded CI run).
        from dcp_invariant.suite import worker

        worker.exit_without_teardown(plan.ELASTIC_EXIT_CODE)
    verdict = [0]
    if job.rank == 0:
        verdict[0] = _write_artifact(observations, run_plan, options, *versions)
    dist.broadcast_object_list(verdict, src=0)
    return int(verdict[0])


def _records(rank: int) -> str:
    """The file of a rank's records from attempt 0, under a scenario's :data:`STATE_DIR`."""
    return f"attempt0-rank{rank}.json"


def _read(path: Path) -> Any:
    try:
        return canonical.loads(regular_file.read(path, bound=durable.MAX_RECORD_BYTES))
    except FileNotFoundError:
        raise InJobError(
            f"{path} is missing: the first attempt did not finish on every rank (see its log)"
        ) from None


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
        for warning in result.warnings:
            print(f"      warning: {warning}", flush=True)
    print(report.summary, flush=True)
    return 0 if report.passed else 1
