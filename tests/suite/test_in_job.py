"""`dcp-invariant in-job` inside real torchrun jobs of several agents ("nodes") on this host.

Each agent is `python -m dcp_invariant.suite.torchrun.launch` (torchrun with the rendezvous
store bound to 127.0.0.1) joining one c10d rendezvous on loopback; Gloo binds `lo`. As root,
two network namespaces joined by a veth pair stand in for two hosts, with plain torchrun in
each. Every agent has a timeout, is killed with its session when a test ends, and no process,
namespace or file is left behind.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import proc_state
import pytest
from cli_runs import REVISION

from dcp_invariant import canonical, plan
from dcp_invariant.commit import CheckpointStore
from dcp_invariant.evidence import diagnosis, schema
from dcp_invariant.evidence.verify import verify_artifact
from dcp_invariant.suite.torchrun import in_job

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(sys.platform != "linux", reason="agents on loopback: Linux here"),
]

TESTS = Path(__file__).resolve().parents[1]
AGENT_TIMEOUT = 600
# The rendezvous of a restarted agent waits join_timeout seconds for its peer before it gives
# up (torch/distributed/elastic/rendezvous/dynamic_rendezvous.py): the first rendezvous too, for
# which both agents start together.
JOIN_TIMEOUT = 30
RDZV_CONF = "last_call_timeout=1,close_timeout=5"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Job:
    agents: list[subprocess.Popen[str]]
    logs: list[Path]
    checkpoint: Path
    output: Path

    def wait(self, timeout: float = AGENT_TIMEOUT) -> list[int]:
        deadline = time.monotonic() + timeout
        return [a.wait(timeout=max(1.0, deadline - time.monotonic())) for a in self.agents]

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in self.logs)


@contextlib.contextmanager
def torchrun_job(
    tmp: Path,
    *,
    nodes: int,
    nproc: int,
    fixture: str = "fixture_loops:correct",
    namespaces: list[str] | None = None,
    endpoint_host: str = "127.0.0.1",
    interface: str = "lo",
    name: str = "",
    resume_from: Path | None = None,
    timeout: int = 60,
    join_timeout: int = JOIN_TIMEOUT,
) -> Iterator[Job]:
    """``nodes`` torchrun agents running ``in-job``; killed, sessions and all, at the end."""
    port = _free_port()
    checkpoint, output = tmp / f"ckpt{name}", tmp / f"evidence{name}"
    restarts = 1 if resume_from is None else 0
    resuming = [] if resume_from is None else ["--resume-from", str(resume_from)]
    agents, logs = [], []
    for node in range(nodes):
        if namespaces is None:
            # The guarded launcher binds the rendezvous store to 127.0.0.1 only.
            launcher = [sys.executable, "-m", "dcp_invariant.suite.torchrun.launch"]
            prefix: list[str] = []
            local = ["--local-addr=127.0.0.1"]
        else:
            # Inside the test's own namespaces: torchrun as users run it.
            launcher = [sys.executable, "-m", "torch.distributed.run"]
            prefix = ["ip", "netns", "exec", namespaces[node]]
            local = []
        command = [
            *prefix, *launcher, f"--nnodes={nodes}", f"--nproc-per-node={nproc}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint_host}:{port}",
            f"--rdzv-id=test-{port}",
            f"--rdzv-conf={RDZV_CONF},join_timeout={join_timeout},is_host={node == 0}".lower(),
            f"--max-restarts={restarts}", "--monitor-interval=0.1", *local,
            "-m", "dcp_invariant", "in-job", "--fixture", fixture,
            "--checkpoint-dir", str(checkpoint), "--output-dir", str(output),
            "--gloo-interface", interface, "--source-revision", REVISION, "--timeout", str(timeout),
            *resuming,
        ]  # fmt: skip
        log = tmp / f"agent{name}{node}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS / "suite")])}
        with open(log, "w", encoding="utf-8") as sink:
            agents.append(
                subprocess.Popen(
                    command,
                    cwd=TESTS,
                    env=env,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    text=True,
                    start_new_session=True,
                )
            )
        logs.append(log)
    job = Job(agents, logs, checkpoint, output)
    try:
        yield job
    finally:
        for agent in agents:
            _kill_session(agent.pid)
            agent.wait(timeout=60)
        assert _processes_using(checkpoint) == [], "a worker outlived its agent"


def _kill_session(pid: int) -> None:
    """SIGKILL an agent's whole session (it started it: start_new_session)."""
    if sys.platform != "win32":  # the module is skipped there; this tells mypy
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def _processes_using(checkpoint: Path) -> list[str]:
    """Processes whose command line names this test's checkpoint directory."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(checkpoint) in cmdline:
            found.append(f"{entry.name}: {cmdline[:200]}")
    return found


def _results(output: Path) -> dict[str, dict[str, object]]:
    return {p.stem: canonical.loads(p.read_bytes()) for p in sorted((output / "results").iterdir())}


def assert_a_correct_job(job: Job, nodes: int, nproc: int) -> None:
    """A correct loop's job: every agent exited 0 and its artifact holds, with no host names."""
    report = verify_artifact(job.output)
    w = nodes * nproc
    assert report.passed, report.problems
    assert report.run_plan.names == (f"resume_{w}", f"async_resume_{w}")
    provenance = canonical.loads((job.output / schema.PROVENANCE_FILE).read_bytes())
    assert provenance["schema_version"] == schema.IN_JOB_SCHEMA_VERSION
    assert provenance["plan"]["launch"] == {
        "backend": "gloo",
        "nodes": nodes,
        "nproc_per_node": nproc,
        "resumed_from": None,
    }
    # Every rank restarted once and loaded the committed generation.
    resume = canonical.loads((job.output / schema.observation_file(f"resume_{w}")).read_bytes())
    assert [r["rank"] for r in resume["target"]["ranks"]] == list(range(w))
    assert resume["commit"]["promoted"] is True
    # No host names, addresses or ports in the evidence.
    evidence = b"".join(p.read_bytes() for p in job.output.rglob("*") if p.is_file())
    assert b"127.0.0.1" not in evidence and socket.gethostname().encode() not in evidence


def test_a_correct_loop_passes_in_a_two_node_job_of_four(tmp_path: Path) -> None:
    started = time.monotonic()
    with torchrun_job(tmp_path, nodes=2, nproc=2) as job:
        assert job.wait() == [0, 0], job.log()
    print(f"in-job W=4: {time.monotonic() - started:.1f} s")  # the note's figure; not asserted
    assert_a_correct_job(job, nodes=2, nproc=2)


def test_a_node_whose_workers_exit_slowly_restarts_with_the_others(tmp_path: Path) -> None:
    """Where one node's workers are still alive when the other node's agent joins the next
    rendezvous, torchrun restarts them as a membership change, which does not count as a
    restart: they would see TORCHELASTIC_RESTART_COUNT 0 again. Rank 1's loop takes seconds to
    exit (an atexit handler), so that order is certain unless the planned restart leaves
    without finalizing, on every rank alike."""
    with torchrun_job(
        tmp_path, nodes=2, nproc=1, fixture="fixture_loops:slow_exit_on_rank_1"
    ) as job:
        assert job.wait() == [0, 0], job.log()
    assert_a_correct_job(job, nodes=2, nproc=1)


def test_a_second_launch_at_another_node_count_resumes_the_first(tmp_path: Path) -> None:
    # The first launch is the two-node job of one process each: a correct loop passes there.
    with torchrun_job(tmp_path, nodes=2, nproc=1, name="-first") as first:
        assert first.wait() == [0, 0], first.log()
    assert_a_correct_job(first, nodes=2, nproc=1)
    # One node of four processes, where the first job had two nodes of one.
    with torchrun_job(
        tmp_path, nodes=1, nproc=4, name="-second", resume_from=first.checkpoint
    ) as second:
        assert second.wait() == [0], second.log()
    report = verify_artifact(second.output)
    assert report.passed, report.problems
    assert report.run_plan.names == ("reshard_2_to_4",)
    provenance = canonical.loads((second.output / schema.PROVENANCE_FILE).read_bytes())
    assert provenance["plan"]["launch"] == {
        "backend": "gloo",
        "nodes": 1,
        "nproc_per_node": 4,
        "resumed_from": 2,
    }
    name = schema.observation_file("reshard_2_to_4")
    observed = canonical.loads((second.output / name).read_bytes())
    # Every one of the four ranks loaded the first job's committed generation, key by key.
    assert [r["rank"] for r in observed["target"]["ranks"]] == [0, 1, 2, 3]
    assert all(r["loaded"] for r in observed["target"]["ranks"])


def test_an_app_that_saves_itself_resumes_through_torchruns_restart(tmp_path: Path) -> None:
    """Its own save() and load() (saving_loops), across the restart of every worker, and its
    async save as it declares; the app drops its scheduler at the load, and the job names it
    by key in both."""
    fixture = "saving_loops:saves_async_scheduler_not_restored"
    with torchrun_job(tmp_path, nodes=1, nproc=2, fixture=fixture) as job:
        assert job.wait() != [0], job.log()
    report = verify_artifact(job.output)
    assert report.valid and not report.passed, report.problems
    assert report.run_plan.names == ("resume_2", "async_resume_2")
    assert report.run_plan.checkpointing == "app" and report.run_plan.saves_async
    for name in report.run_plan.names:
        reasons = str(_results(job.output)[name]["reasons"])
        assert f"{diagnosis.APP_ROUND_TRIP}: rank 1: app.sched." in reasons, reasons
    resume = canonical.loads((job.output / schema.observation_file("resume_2")).read_bytes())
    assert [f["path"] for f in resume["commit"]["files"]] == ["rank0.pt", "rank1.pt"]


def test_a_resume_bug_fails_the_job_naming_the_cause(tmp_path: Path) -> None:
    with torchrun_job(tmp_path, nodes=2, nproc=1, fixture="fixture_loops:rng_outside_state") as job:
        codes = job.wait()
        assert all(code != 0 for code in codes), job.log()
    results = _results(job.output)
    assert {name: r["verdict"] for name, r in results.items()} == {
        "async_resume_2": "fail",
        "resume_2": "fail",
    }
    assert str(results["resume_2"]["reasons"]).count(diagnosis.OUTSIDE_STATE_DICT) >= 1
    assert not verify_artifact(job.output).passed


def test_a_node_lost_after_the_save_fails_and_promotes_nothing_partial(tmp_path: Path) -> None:
    # The survivor's restarted agent waits join_timeout for the lost node: half the default.
    with torchrun_job(tmp_path, nodes=2, nproc=1, join_timeout=JOIN_TIMEOUT // 2) as job:
        # The first scenario's checkpoint is committed once its record is written; the second
        # scenario's save starts right after: lose node 1 then.
        committed = job.checkpoint / "resume_2" / in_job.STATE_DIR / in_job.COMMIT_FILE
        deadline = time.monotonic() + AGENT_TIMEOUT
        while not committed.exists() and time.monotonic() < deadline:
            assert job.agents[0].poll() is None, job.log()
            time.sleep(0.05)
        _kill_session(job.agents[1].pid)
        started = time.monotonic()
        try:
            code = job.agents[0].wait(timeout=AGENT_TIMEOUT)
        except subprocess.TimeoutExpired:
            # What the surviving node was waiting on, from its own log and its workers'.
            pytest.fail(f"the surviving agent ran on {AGENT_TIMEOUT} s after the loss: {job.log()}")
        waited = time.monotonic() - started
        assert code != 0, job.log()
    # The survivor gave up within its rendezvous timeouts; nothing was judged, so no pass.
    assert waited < 240, waited
    assert not (job.output / schema.MANIFEST_FILE).exists()
    # The committed generation is whole; the save the lost node was part of is not promoted.
    resumed = CheckpointStore(job.checkpoint / "resume_2" / "ckpt")
    assert resumed.pointer_bytes() is not None
    resumed.resolve()  # verifies the generation against its receipt; raises if it is not whole
    assert CheckpointStore(job.checkpoint / "async_resume_2" / "ckpt").pointer_bytes() is None


# --- an interrupt to either agent, at seeded moments ---------------------------------------

# An agent stops its workers with SIGTERM, then SIGKILL after 30 s (``PContext.close``'s timeout,
# torch/distributed/elastic/multiprocessing/api.py); an agent SIGKILLed takes its workers with it
# (``worker.die_with_parent``). A peer's workers stop when a collective with a dead rank fails,
# when their own agent, finding the rendezvous store gone, stops them the same way, or, where
# they wait for a rank that will never come (the process group's store, a barrier), when the
# job's own ``--timeout`` for a collective runs out: torchrun's agent that hosts the rendezvous
# does not stop its workers for a lost peer. The job here takes a short one.
JOB_TIMEOUT = 20
STOP_BOUND = JOB_TIMEOUT + 30 + 15.0
INTERRUPT_SEED = 28
SIGNALS = ("SIGINT", "SIGTERM", "SIGKILL")
# When the signal goes: as the first workers start (importing torch, before any rendezvous of
# theirs), as the restarted workers start, or at a seeded point of the first attempt's progress.
WORKERS_START, RESTART = "workers start", "restart"


@dataclass(frozen=True)
class Progress:
    """A seeded moment of the first attempt: ``after`` seconds once ``path`` (under the job's
    checkpoint directory) exists. Tied to what the job has done, not to the clock, so it comes
    before the restart on a fast machine and a slow one alike."""

    path: str
    after: float

    def __str__(self) -> str:
        return f"{self.path}+{self.after}"


def _progress_marks() -> list[str]:
    """What the first attempt of a two-node job of one process each leaves on disk, in order:
    each scenario's state directory as its arms start, then its commit record."""
    launch = plan.Launch(2, 1, "gloo", None)
    scenarios = plan.in_job_plan("fixture_loops:correct", launch).scenarios
    return [
        mark
        for s in scenarios
        for mark in (
            f"{s.name}/{in_job.STATE_DIR}",
            f"{s.name}/{in_job.STATE_DIR}/{in_job.COMMIT_FILE}",
        )
    ]


def interrupt_cases() -> list[tuple[int, str, str | Progress]]:
    """(agent, signal, moment): each agent at the workers' start, then one at the restart and
    the other at a seeded point of the first attempt; each signal at least once, in a seeded
    order. A commit record is followed by the next scenario's arms or by the restart, each
    seconds long, so a point up to 0.5 s after a mark still falls inside the run."""
    rng = random.Random(INTERRUPT_SEED)
    signals = [*rng.sample(SIGNALS, len(SIGNALS)), rng.choice(SIGNALS)]
    late = rng.randrange(2)
    seeded = Progress(rng.choice(_progress_marks()), round(rng.uniform(0.0, 0.5), 1))
    moments: list[tuple[int, str | Progress]] = [(0, WORKERS_START), (1, WORKERS_START)]
    moments += [(late, RESTART), (1 - late, seeded)]
    return [(a, s, m) for (a, m), s in zip(moments, signals, strict=True)]


def _workers(job: Job) -> dict[int, int]:
    """The job's workers (pid: the index of the agent that started it), read from /proc."""
    agents = {agent.pid: i for i, agent in enumerate(job.agents)}
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = proc_state.stat(int(entry.name))  # state, then the parent's PID
        if fields is not None and len(fields) > 1 and int(fields[1]) in agents:
            found[int(entry.name)] = agents[int(fields[1])]
    return found


def _wait_for_moment(job: Job, moment: str | Progress, deadline: float) -> bool:
    """Wait for the moment; False if the job ended first."""
    reached: float | None = None
    first: set[int] = set()
    while time.monotonic() < deadline:
        if any(a.poll() is not None for a in job.agents):
            return False
        workers = set(_workers(job))
        if isinstance(moment, Progress):
            if reached is None and (job.checkpoint / moment.path).exists():
                reached = time.monotonic()
            if reached is not None and time.monotonic() - reached >= moment.after:
                return True
        elif moment == WORKERS_START and workers:
            return True
        elif moment == RESTART:
            # The first generation, once seen whole (one worker per agent); then any new one.
            if len(first) < len(job.agents):
                first |= workers
            elif workers - first:
                return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize(
    ("agent", "signame", "moment"),
    interrupt_cases(),
    ids=[f"{'AB'[a]}-{s}-{m}" for a, s, m in interrupt_cases()],
)
def test_an_interrupt_to_either_agent_ends_every_workers_of_both(
    tmp_path: Path, agent: int, signame: str, moment: str | Progress
) -> None:
    with torchrun_job(tmp_path, nodes=2, nproc=1, timeout=JOB_TIMEOUT) as job:
        if not _wait_for_moment(job, moment, time.monotonic() + AGENT_TIMEOUT):
            pytest.fail(f"the job ended before {moment}: {job.log()}")
        # Ctrl-C reaches the agent alone: torchrun starts each worker in a session of its own.
        job.agents[agent].send_signal(getattr(signal, signame))
        signalled = time.monotonic()
        # A worker whose agent has exited is reparented, so it is no longer found by its parent:
        # each one seen is followed until it is gone.
        seen = set(_workers(job))
        while time.monotonic() - signalled < STOP_BOUND:
            seen |= set(_workers(job))
            if not (alive := {pid for pid in seen if proc_state.alive(pid)}):
                break
            time.sleep(0.1)
        survivors = [
            line for line in _processes_using(job.checkpoint) if int(line.split(":")[0]) in alive
        ]
        took = time.monotonic() - signalled
        interrupted = job.agents[agent]
        with contextlib.suppress(subprocess.TimeoutExpired):
            interrupted.wait(timeout=max(1.0, STOP_BOUND - took))
        print(f"{'AB'[agent]} {signame} at {moment}: workers gone after {took:.1f} s")
        assert survivors == [], f"workers alive {STOP_BOUND} s after the {signame}: {survivors}"
        assert interrupted.poll() is not None, f"agent {'AB'[agent]} outlived its {signame}"
    # Nothing was judged: no evidence, however far the run had got.
    assert not (job.output / schema.MANIFEST_FILE).exists()


def _netns_available() -> str:
    if sys.platform == "win32" or os.geteuid() != 0 or shutil.which("ip") is None:
        return "needs root and iproute2's ip"
    probe = subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, timeout=30, check=False
    )
    return "" if probe.returncode == 0 else f"ip netns is not available: {probe.stderr.strip()}"


# Both ends of the pair take this name inside their namespace, so one --gloo-interface names
# each host's own end, as one interface name does across a cluster's identical nodes.
INTERFACE = "dcpi0"


@contextlib.contextmanager
def two_hosts(tag: str) -> Iterator[tuple[list[str], str]]:
    """Two namespaces joined by a veth pair with addresses of their own; removed afterwards."""
    names = [f"dcpi-{tag}-a", f"dcpi-{tag}-b"]
    ends = [f"dv{tag}a", f"dv{tag}b"]
    addresses = ["10.213.7.1", "10.213.7.2"]

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)

    try:
        for name in names:
            ip("netns", "add", name)
        ip("link", "add", ends[0], "type", "veth", "peer", "name", ends[1])
        for name, end, address in zip(names, ends, addresses, strict=True):
            ip("link", "set", end, "netns", name)
            ip("-n", name, "link", "set", end, "name", INTERFACE)
            ip("-n", name, "addr", "add", f"{address}/30", "dev", INTERFACE)
            ip("-n", name, "link", "set", INTERFACE, "up")
            ip("-n", name, "link", "set", "lo", "up")
        yield names, addresses[0]
    finally:
        for name in names:
            subprocess.run(
                ["ip", "netns", "del", name], capture_output=True, timeout=30, check=False
            )


def test_two_hosts_joined_by_a_veth_pair(tmp_path: Path) -> None:
    reason = _netns_available()
    if reason:
        pytest.skip(reason)
    tag = str(os.getpid() % 10000)
    with (
        two_hosts(tag) as (namespaces, host_address),
        torchrun_job(
            tmp_path,
            nodes=2,
            nproc=1,
            namespaces=namespaces,
            endpoint_host=host_address,
            interface=INTERFACE,
        ) as job,
    ):
        codes = job.wait()
        assert codes == [0, 0], job.log()
    assert verify_artifact(job.output).passed
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    assert f"dcpi-{tag}" not in listed.stdout


@pytest.mark.parametrize("bad", ["misspelt fixture", "output dir is a file"])
def test_bad_input_is_one_line_a_rank_on_both_attempts_and_writes_nothing(
    tmp_path: Path, bad: str
) -> None:
    """Each rank says the problem in one line and exits 2; torchrun's restart meets the same
    refusal, not a missing record of the first attempt; the checkpoint directory stays empty
    (issue #46, item 4)."""
    fixture = "fixture_loop:correct" if bad == "misspelt fixture" else "fixture_loops:correct"
    if bad == "output dir is a file":
        (tmp_path / "evidence").write_text("mine\n")
    with torchrun_job(tmp_path, nodes=1, nproc=2, fixture=fixture) as job:
        assert job.wait() != [0], job.log()
    # The whole log (job.log() keeps its tail, which torchrun's own report fills). Two ranks
    # write to one agent's output, so one rank's line may end on another's: split by message.
    log = "".join(p.read_text(errors="replace") for p in job.logs)
    said = re.findall(r"dcp-invariant: error: (.*?)(?=dcp-invariant: error:|\n|$)", log)
    # Both attempts refused with exit 2 (torchrun names each attempt's first failure). A rank
    # may be stopped by the agent (SIGTERM, once its peer failed) before it says its line:
    # seen under load, so two to four lines, each the one refusal.
    assert log.count("failed (exitcode: 2)") == 2, log
    assert 2 <= len(said) <= 4, log
    assert len(set(said)) == 1, said
    expected = "cannot import 'fixture_loop'" if bad == "misspelt fixture" else "evidence"
    assert expected in said[0], said
    # No worker's traceback (torchrun's agent prints its own ChildFailedError).
    for frame in ("in_job.py", "fixture.py", "cli.py", "FixtureError", "OutputDirError"):
        assert frame not in log, log
    assert not job.checkpoint.exists() or not any(job.checkpoint.rglob("*")), sorted(
        str(p.relative_to(job.checkpoint)) for p in job.checkpoint.rglob("*")
    )
    if bad == "output dir is a file":
        assert (tmp_path / "evidence").read_text() == "mine\n"
