"""``preempt`` on real jobs: killed at their own saves, relaunched, judged."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dcp_invariant.evidence import diagnosis

pytestmark = [pytest.mark.live, pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD")]

JOBS = Path(__file__).resolve().parent.parent / "preempt_jobs"


def preempt(tmp_path: Path, *job: str, points: int = 8) -> subprocess.CompletedProcess[str]:
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


def test_a_torch_save_overwritten_in_place_cannot_resume(tmp_path: Path) -> None:
    done = preempt(tmp_path, sys.executable, "single_process.py", "{run_dir}", "--save", "in_place")
    assert done.returncode == 1, done.stdout + done.stderr
    failures = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert failures, done.stdout
    assert all(
        f"FAIL  {diagnosis.CANNOT_RESUME}: killed before rank main operation" in f for f in failures
    )
    # Cut short mid-write: the kills inside torch.save's writes are the ones that crash-loop.
    assert all("(write ckpt.pt)" in f for f in failures), failures
    # Its scratch is gone (the job's own caches, torch's inductor directory, are the job's).
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("dcp-invariant-")]


def test_a_save_replaced_atomically_passes_at_every_point(tmp_path: Path) -> None:
    done = preempt(tmp_path, sys.executable, "single_process.py", "{run_dir}", "--save", "atomic")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(rename ckpt.pt.tmp -> ckpt.pt)" in done.stdout
    assert "FAIL" not in done.stdout


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
    done = preempt(tmp_path, *TORCHRUN, points=6)
    assert done.returncode == 1, done.stdout + done.stderr
    failures = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert failures and all(f"FAIL  {diagnosis.CANNOT_RESUME}: " in f for f in failures), failures
    assert any("step-4/" in f or "step-2/" in f for f in failures), failures


def test_the_same_job_checking_for_metadata_resumes_at_every_point(tmp_path: Path) -> None:
    done = preempt(tmp_path, *TORCHRUN, "--check-metadata", points=6)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ranks 0, 1" in done.stdout
