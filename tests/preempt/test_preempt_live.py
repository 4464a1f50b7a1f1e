"""``preempt`` on real jobs: killed at their own saves, relaunched, judged."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dcp_invariant.evidence import diagnosis

pytestmark = [pytest.mark.live, pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD")]

JOBS = Path(__file__).resolve().parent.parent / "preempt_jobs"


def preempt(tmp_path: Path, *job: str, points: int = 6) -> subprocess.CompletedProcess[str]:
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
            "--final",
            "final.pt" if "single_process.py" in " ".join(job) else "final",
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


def test_a_torch_save_overwritten_in_place_cannot_resume(tmp_path: Path) -> None:
    done = preempt(tmp_path, sys.executable, "single_process.py", "{run_dir}", "--save", "in_place")
    assert done.returncode == 1, done.stdout + done.stderr
    causes, points = failures(done.stdout)
    assert len(causes) == 1 and causes[0].startswith(f"FAIL  {diagnosis.CANNOT_RESUME}: at "), (
        causes
    )
    # Cut short mid-write: the kills inside torch.save's writes are the ones that crash-loop.
    assert points and all("(write ckpt.pt)" in p for p in points), points
    assert "      | " in done.stdout  # the relaunch's own last lines
    # Its scratch is gone (the job's own caches, torch's inductor directory, are the job's).
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("dcp-invariant-")]


def test_a_save_replaced_atomically_passes_at_every_point(tmp_path: Path) -> None:
    done = preempt(tmp_path, sys.executable, "single_process.py", "{run_dir}", "--save", "atomic")
    assert done.returncode == 0, done.stdout + done.stderr
    (passed,) = [line for line in done.stdout.splitlines() if line.startswith("ok    ")]
    assert "(rename ckpt.pt.tmp -> ckpt.pt)" in passed
    assert failures(done.stdout) == ([], [])


TORCHRUN = [
    sys.executable,
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc-per-node",
    "2",
    "--local-addr",
    "127.0.0.1",
    "dcp_steps.py",
    "{run_dir}",
]


def test_a_torchrun_job_that_takes_a_step_folder_without_metadata_cannot_resume(
    tmp_path: Path,
) -> None:
    done = preempt(tmp_path, *TORCHRUN, points=4)
    assert done.returncode == 1, done.stdout + done.stderr
    causes, points = failures(done.stdout)
    assert len(causes) == 1 and causes[0].startswith(f"FAIL  {diagnosis.CANNOT_RESUME}: "), causes
    assert points and all("step-" in p for p in points), points


def test_the_same_job_checking_for_metadata_resumes_at_every_point(tmp_path: Path) -> None:
    done = preempt(tmp_path, *TORCHRUN, "--check-metadata", points=4)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ranks 0, 1" in done.stdout


@pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None, reason="needs the loops extra"
)
def test_a_trainer_job_resuming_from_get_last_checkpoint_cannot_resume(tmp_path: Path) -> None:
    """huggingface/transformers#35782: the newest checkpoint-N, half written, is taken."""
    done = subprocess.run(
        [
            sys.executable, "-m", "dcp_invariant", "preempt", "--crash-points", "6",
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
