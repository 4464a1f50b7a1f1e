"""``preempt`` on real jobs: killed at their own saves, relaunched, judged."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import dcp_invariant
from dcp_invariant.evidence import diagnosis

pytestmark = [pytest.mark.live, pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD")]

JOBS = Path(__file__).resolve().parent.parent / "preempt_jobs"
# The slower jobs (a torchrun job's launches each import torch three times; Trainer imports
# transformers): marked real_loops, they run weekly with tests/suite/test_real_loops.py
# (.github/workflows/newest-torch.yml), as `-m real_loops` names them. Every change runs the
# others: a job that fails, one that passes, and one whose relaunch must run as launched.
MARKER = "real_loops"
SLOW = pytest.mark.real_loops


@pytest.fixture(autouse=True)
def _slow_runs_only_when_named(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker(MARKER) and MARKER not in request.config.option.markexpr:
        pytest.skip(f"slow real job: runs with -m {MARKER}")


def preempt(
    tmp_path: Path,
    *job: str,
    points: int = 6,
    options: tuple[str, ...] = (),
    final: str | None = "",
) -> subprocess.CompletedProcess[str]:
    if final == "":
        final = "final" if "torch.distributed.run" in job else "final.pt"
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dcp_invariant",
            "preempt",
            "--crash-points",
            str(points),
            "--timeout",
            "120",
            *(("--final", final) if final else ()),
            *options,
            "--",
            *job,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=JOBS,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        check=False,
    )


def failures(stdout: str) -> tuple[list[str], list[str]]:
    """The causes a run reports (its FAIL lines) and the crash points listed under them."""
    lines = stdout.splitlines()
    causes = [line for line in lines if line.startswith("FAIL  ")]
    points = [line.strip()[2:] for line in lines if line.startswith("      - killed before ")]
    return causes, points


def test_a_torch_save_overwritten_in_place_cannot_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through check_job(), the Python API: the job runs from the caller's directory."""
    monkeypatch.chdir(JOBS)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    report = dcp_invariant.check_job(
        [sys.executable, "single_process.py", "{run_dir}", "--save", "in_place"],
        final="final.pt",
        crash_points=6,
        timeout=120,
        sigterm_points=1,
        grace=5,
    )
    assert not report.passed, str(report)
    failed = [p for p in report.points if p.reasons]
    # Cut short mid-write: the kills inside torch.save's writes are the ones that crash-loop.
    assert failed and all("(write ckpt.pt)" in p.name for p in failed), str(report)
    # The job has no SIGTERM handler, so SIGTERM ends it as a kill would, and is judged alike.
    assert [p.name.split(" before ")[0] for p in report.points].count("sent SIGTERM") == 1
    assert all(
        r.startswith(f"{diagnosis.CANNOT_RESUME}: {p.name}:") for p in failed for r in p.reasons
    )
    causes, points = failures(str(report))
    assert len(causes) == 1 and len(points) == len(failed)
    assert "      | " in str(report)  # the relaunch's own last lines
    # Its scratch is gone (the job's own caches, torch's inductor directory, are the job's).
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("dcp-invariant-")]


def test_a_save_replaced_atomically_passes_at_every_point(tmp_path: Path) -> None:
    # One save: its rename is a crash point whatever the budget, and two points more.
    job = (sys.executable, "single_process.py", "{run_dir}", "--save", "atomic", "--steps", "2")
    done = preempt(tmp_path, *job, points=3)
    assert done.returncode == 0, done.stdout + done.stderr
    (passed,) = [line for line in done.stdout.splitlines() if line.startswith("ok    ")]
    assert "(rename ckpt.pt.tmp -> ckpt.pt)" in passed
    assert failures(done.stdout) == ([], [])


def test_a_relaunch_that_fails_only_once_on_a_state_is_not_judged(tmp_path: Path) -> None:
    """The job aborts the first time it resumes from each checkpoint, as a job whose end is
    flaky does: a failing relaunch runs again on an untouched copy of its state, and a point
    whose two relaunches end otherwise is a skip, not `cannot resume`."""
    seen = tmp_path / "seen"
    seen.mkdir()
    job = (sys.executable, "single_process.py", "{run_dir}", "--save", "atomic")
    done = preempt(
        tmp_path,
        *job,
        "--abort-first-resume",
        str(seen),
        points=6,
        options=("--sigterm-points", "0"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert failures(done.stdout) == ([], []), done.stdout
    skips = [line for line in done.stdout.splitlines() if line.startswith("skip  ")]
    assert skips and all(
        "two relaunches on this one state ended otherwise (exit code -6, with no step, then exit "
        "code 0, from step " in line
        for line in skips
    ), done.stdout


def test_a_sigterm_points_relaunch_that_fails_only_once_is_not_judged(tmp_path: Path) -> None:
    """As above, for the state a SIGTERM left: it is copied before its first relaunch."""
    job = (sys.executable, "aborts_after_sigterm.py", "{run_dir}", "--save", "atomic")
    options = ("--sigterm-points", "2", "--grace", "5")
    done = preempt(tmp_path, *job, "--steps", "6", points=2, options=options)
    assert done.returncode == 0, done.stdout + done.stderr
    skips = [line for line in done.stdout.splitlines() if line.startswith("skip  ")]
    assert len(skips) == 2 and all(
        line.startswith("skip  sent SIGTERM before ")
        and "two relaunches on this one state ended otherwise (exit code -6" in line
        for line in skips
    ), done.stdout


def sigterm_job(tmp_path: Path, on_sigterm: str) -> subprocess.CompletedProcess[str]:
    job = (sys.executable, "single_process.py", "{run_dir}", "--save", "atomic", "--steps", "6")
    options = ("--sigterm-points", "2", "--grace", "20")
    return preempt(tmp_path, *job, "--on-sigterm", on_sigterm, points=2, options=options)


def test_a_save_on_sigterm_without_the_generator_resumes_to_another_result(
    tmp_path: Path,
) -> None:
    """The job saves on SIGTERM and exits, as jobs that save on preemption do, but leaves its
    generator's state out of that save: every SIGKILL point passes; a SIGTERM before a save
    with steps left after it fails (one at the last save has no step left to draw)."""
    done = sigterm_job(tmp_path, "save_without_rng")
    assert done.returncode == 1, done.stdout + done.stderr
    causes, killed = failures(done.stdout)
    assert killed == [], done.stdout
    assert causes == [f"FAIL  {diagnosis.OTHER_RESULT}: at 1 of 7 crash points"], done.stdout
    signalled = [line for line in done.stdout.splitlines() if "- sent SIGTERM before" in line]
    assert len(signalled) == 2, done.stdout  # a step line and the final state
    assert "after step 4 (SIGKILL 20 s later): step 5: loss " in signalled[0]
    (passed,) = [line for line in done.stdout.splitlines() if line.startswith("ok    ")]
    assert passed.count("killed before ") == 5 and passed.count("sent SIGTERM before ") == 1


@SLOW
def test_a_job_that_saves_on_sigterm_passes(tmp_path: Path) -> None:
    done = sigterm_job(tmp_path, "save")
    assert done.returncode == 0, done.stdout + done.stderr
    (passed,) = [line for line in done.stdout.splitlines() if line.startswith("ok    ")]
    assert passed.count("sent SIGTERM before") == 2, done.stdout


@SLOW
def test_a_job_under_accelerate_launch_is_heard_through_the_launcher(tmp_path: Path) -> None:
    """``accelerate launch`` starts the job as a child process: its writes are heard as the
    job's, and the job's own error leads the relaunch's output, not accelerate's."""
    pytest.importorskip("accelerate")  # imports no torch
    accelerate = str(Path(sys.executable).parent / "accelerate")  # its console script
    launcher = (accelerate, "launch", "--cpu", "--num_processes", "1")
    job = (*launcher, "single_process.py", "{run_dir}", "--save", "in_place")
    done = preempt(tmp_path, *job, points=6, options=("--sigterm-points", "0"))
    assert done.returncode == 1, done.stdout + done.stderr
    causes, points = failures(done.stdout)
    assert causes == [f"FAIL  {diagnosis.CANNOT_RESUME}: at 2 of 6 crash points"], done.stdout
    assert all("(write ckpt.pt)" in p for p in points), points
    assert "first error and last lines:\n      | OSError: " in done.stdout, done.stdout


def async_job(tmp_path: Path, latest: str) -> subprocess.CompletedProcess[str]:
    job = (sys.executable, "async_steps.py", "{run_dir}", "--latest", latest)
    return preempt(tmp_path, *job, points=8, options=("--sigterm-points", "0"))


def test_a_pointer_written_before_an_async_save_is_done_cannot_resume(tmp_path: Path) -> None:
    """``latest`` names a step-N while async_save's thread still writes it: a kill then leaves
    the pointer on a folder without .metadata, and every relaunch fails on it."""
    done = async_job(tmp_path, "at_once")
    assert done.returncode == 1, done.stdout + done.stderr
    causes, points = failures(done.stdout)
    assert len(causes) == 1 and causes[0].startswith(f"FAIL  {diagnosis.CANNOT_RESUME}: "), causes
    # Killed inside the background thread's writes of a step-N folder, or before its rename
    # of .metadata into place: training had gone on past the save by then.
    assert points and all(re.search(r"\(\w+ step-\d+", p) for p in points), points
    assert "metadata is None" in done.stdout  # DCP's own words, from the relaunch


@SLOW
def test_a_pointer_written_once_the_async_save_is_done_passes(tmp_path: Path) -> None:
    done = async_job(tmp_path, "when_done")
    assert done.returncode == 0, done.stdout + done.stderr
    (passed,) = [line for line in done.stdout.splitlines() if line.startswith("ok    ")]
    assert re.search(r"killed before rank main operation \d+ \(write step-\d+/__0_0", passed)


def test_a_relaunch_runs_the_script_as_a_fresh_launch_would(tmp_path: Path) -> None:
    """Relaunches of `python script.py` are forked from a server that imported torch once:
    argv, __name__, sys.path[0], the working directory and the environment must be as a fresh
    launch sets them, or the job's step lines (a digest of them) would differ; and it must end
    as the interpreter's exit does, or its final file would. Its evidence is the same bytes in
    two checks, and verify derives the verdicts again from it."""
    job = (sys.executable, "as_launched.py", "{run_dir}")
    evidence = [tmp_path / "first", tmp_path / "second"]
    done = [
        preempt(tmp_path, *job, points=4, final="final.txt", options=("--output-dir", str(e)))
        for e in evidence
    ]
    assert done[0].returncode == 0, done[0].stdout + done[0].stderr
    assert "ok    " in done[0].stdout and failures(done[0].stdout) == ([], [])
    first, second = ((e / "preempt.json").read_bytes() for e in evidence)
    assert first == second
    assert str(tmp_path).encode() not in first  # no path: the command by its digest
    verified = subprocess.run(
        [sys.executable, "-m", "dcp_invariant", "verify", str(evidence[0])],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert verified.stdout.splitlines()[-1].startswith("pass: ")


TWO_RANKS = [
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc-per-node",
    "2",
    "--local-addr",
    "127.0.0.1",
]
TORCHRUN = [
    *TWO_RANKS,
    "dcp_steps.py",
    "{run_dir}",
    # One save (step 2) and the final one: the fewest launches that still leave a step-N
    # without .metadata at a crash point, and a whole one beside it.
    "--steps",
    "2",
]


@SLOW
def test_a_torchrun_job_that_takes_a_step_folder_without_metadata_cannot_resume(
    tmp_path: Path,
) -> None:
    done = preempt(tmp_path, *TORCHRUN, points=4)
    assert done.returncode == 1, done.stdout + done.stderr
    causes, points = failures(done.stdout)
    assert len(causes) == 1 and causes[0].startswith(f"FAIL  {diagnosis.CANNOT_RESUME}: "), causes
    assert points and all("step-" in p for p in points), points


@SLOW
def test_the_same_job_checking_for_metadata_resumes_at_every_point(tmp_path: Path) -> None:
    done = preempt(tmp_path, *TORCHRUN, "--check-metadata", points=4)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ranks 0, 1" in done.stdout


@SLOW
def test_torchtitan_checkpoint_manager_skips_unfinished_steps(tmp_path: Path) -> None:
    """torchtitan 0.3.0's own CheckpointManager (tests/preempt_jobs/torchtitan_steps.py),
    rotating its step-N folders: a kill before DCP renames a step-N's .metadata into place
    (torch/distributed/checkpoint/filesystem.py) leaves a folder that ``_find_load_step``
    passes over, so the relaunch resumes from the save before it and ends alike."""
    pytest.importorskip("torchtitan", minversion="0.3.0")  # imports no torch
    done = preempt(tmp_path, *TWO_RANKS, "torchtitan_steps.py", "{run_dir}", points=4)
    assert done.returncode == 0, done.stdout + done.stderr
    assert failures(done.stdout) == ([], [])
    (passed,) = [line for line in done.stdout.splitlines() if line.startswith("ok    ")]
    unfinished = re.findall(
        r"\(rename (checkpoint/step-\d+)/\.metadata\.tmp -> \1/\.metadata\)", passed
    )
    # A relaunch that took any of these folders would fail to load it. The saves before the
    # first rotation: the purge thread's deletions of step-2 race the steps after step 6, so
    # a later point of rank 0 can be one the second launch did not make alike (a skip).
    assert unfinished[:3] == ["checkpoint/step-2", "checkpoint/step-4", "checkpoint/step-6"]
    assert "ranks 0, 1" in done.stdout


@SLOW
@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs the loops extra"
)
def test_a_trainer_job_resuming_from_get_last_checkpoint_cannot_resume(tmp_path: Path) -> None:
    """huggingface/transformers#35782: the newest checkpoint-N, half written, is taken."""
    done = subprocess.run(
        [
            sys.executable, "-m", "dcp_invariant", "preempt", "--crash-points", "4",
            "--timeout", "120", "--final", "final/model.safetensors", "--",
            sys.executable, "hf_trainer.py", "{run_dir}",
        ],
        capture_output=True, text=True, timeout=600, cwd=JOBS,
        env={**os.environ, "TMPDIR": str(tmp_path)}, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    causes, points = failures(done.stdout)
    assert len(causes) == 1 and causes[0].startswith(f"FAIL  {diagnosis.CANNOT_RESUME}: "), causes
    assert points and all("checkpoint-" in p for p in points), points
    # The relaunch's own error: the checkpoint's trainer_state.json, written last, is missing.
    assert "| FileNotFoundError: " in done.stdout, done.stdout


@SLOW
@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs the loops extra"
)
def test_the_trainer_job_at_two_processes_cannot_resume_inside_a_checkpoint(
    tmp_path: Path,
) -> None:
    """The same job under torchrun (CPU, gloo), each rank writing its rng_state_{rank}.pth:
    a kill inside checkpoint-N crash-loops as at one process. Its silent wrong resume, a
    checkpoint-N whole but for rng_state_1.pth (Trainer._load_rng_state skips a missing one at
    INFO level), needs rank 1 dead while rank 0 goes on to trainer_state.json: no crash point
    leaves it, as each stops both ranks at one instant and rank 1 writes its file while rank 0
    is still at the checkpoint's first files (docs/preempt.md)."""
    job = (*TWO_RANKS, "hf_trainer.py", "{run_dir}")
    options = ("--sigterm-points", "0")
    done = preempt(tmp_path, *job, points=6, options=options, final="final/model.safetensors")
    assert done.returncode == 1, done.stdout + done.stderr
    causes, points = failures(done.stdout)
    assert len(causes) == 1 and causes[0].startswith(f"FAIL  {diagnosis.CANNOT_RESUME}: "), causes
    assert points and all("checkpoint-" in p for p in points), points
    assert "ranks 0, 1" in done.stdout


@pytest.mark.parametrize(
    ("signame", "after"),
    [("SIGINT", 1.5), ("SIGTERM", 5.0), ("SIGTERM", 6.0), ("SIGTERM", 7.0)],
    # The second launch ends about 4.5 s in; the relaunch server then imports torch.
    ids=["SIGINT in the first launch", "SIGTERM at 5 s", "SIGTERM at 6 s", "SIGTERM at 7 s"],
)
def test_an_interrupt_stops_every_launch_within_two_seconds(
    tmp_path: Path, signame: str, after: float
) -> None:
    """During the first uninterrupted launch, or while crash states are relaunched: exit 130 or
    143, one line, no launch left running, no scratch left."""
    marker = f"dcpi-preempt-test-{os.getpid()}-{signame}-{after}"
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "dcp_invariant", "preempt", "--crash-points", "40",
            "--", sys.executable, "slow_steps.py", "{run_dir}",
        ],
        cwd=JOBS, env={**os.environ, "TMPDIR": str(tmp_path), "DCPI_TEST_MARK": marker},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        time.sleep(after)
        if sys.platform == "win32":
            raise NotImplementedError
        os.killpg(proc.pid, getattr(signal, signame))  # as a terminal or a runner's cancel
        sent = time.monotonic()
        _, stderr = proc.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + getattr(signal, signame), stderr
    assert stderr == "dcp-invariant: interrupted: nothing written\n"
    assert took < 2.0, took
    assert _carrying(marker) == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("dcp-invariant-")]


def _carrying(marker: str) -> list[int]:
    """The processes whose environment holds ``marker``: what the job started and left."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue  # it ended meanwhile
    return found
