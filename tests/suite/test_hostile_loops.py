"""A loop that leaves processes or threads behind or changes directory: the run ends on time,
kills and names what was left, and keeps its files where they belong."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dcp_invariant import canonical
from dcp_invariant.evidence import schema
from dcp_invariant.evidence.verify import verify_artifact
from dcp_invariant.suite import reaper

pytestmark = pytest.mark.live

TESTS = Path(__file__).resolve().parent.parent
REVISION = "0123456789abcdef0123456789abcdef01234567"
linux_only = pytest.mark.skipif(not reaper.supported(), reason="reads /proc")


def run(
    tmp_path: Path,
    fixture: str,
    cwd: Path = TESTS,
    world_sizes: str = "1",
    timeout: str = "60",
    **env: str,
) -> subprocess.CompletedProcess[str]:
    """``run --fixture FIXTURE --world-sizes 1`` with a TMPDIR of its own under ``tmp_path``."""
    private = tmp_path / "tmp"
    private.mkdir()
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dcp_invariant",
            "run",
            "--output-dir",
            str(tmp_path / "out"),
            "--source-revision",
            REVISION,
            "--fixture",
            fixture,
            "--world-sizes",
            world_sizes,
            "--timeout",
            timeout,
        ],
        capture_output=True,
        text=True,
        # The children sleep 600 s: a run that waited for them would not end in time.
        timeout=240,
        cwd=cwd,
        env={**os.environ, "TMPDIR": str(private), **env},
        check=False,
    )


def carrying(marker: str) -> list[int]:
    return [
        int(e.name)
        for e in Path("/proc").iterdir()
        if e.name.isdigit() and marker.encode() in _environ(e)
    ]


def _environ(entry: Path) -> bytes:
    try:
        return (entry / "environ").read_bytes()
    except OSError:
        return b""


@linux_only
@pytest.mark.parametrize("fixture", ["leaves_a_daemon", "double_forks"])
def test_a_child_left_behind_is_killed_with_its_group_and_named(
    tmp_path: Path, fixture: str
) -> None:
    proc = run(tmp_path, f"hostile_loops:{fixture}")
    assert proc.returncode == 0, proc.stderr  # a leftover is a warning, not a failed resume
    # Every group that reached the second step left one; each is named once it ended.
    warnings = re.findall(
        r"^\s+warning: (\w+): left (\w+) running; killed when it ended$", proc.stdout, re.M
    )
    for group in ("never_saves", "reference", "repeat"):
        assert (group, "sleep") in warnings, proc.stdout
    assert carrying(str(tmp_path)) == []
    assert list((tmp_path / "tmp").iterdir()) == []
    # The evidence says it too, and the verifier derives the same warnings from it.
    report = verify_artifact(tmp_path / "out")
    assert report.passed, report.problems
    result = canonical.loads((tmp_path / "out" / schema.result_file("resume_1")).read_bytes())
    assert result["warnings"] == [
        f"{group}: left sleep running; killed when it ended"
        for group in ("never_saves", "reference", "repeat")
    ]


@linux_only
def test_what_torchruns_ranks_leave_behind_is_named_too(tmp_path: Path) -> None:
    """The elastic scenario's ranks are torchrun's, in sessions of their own: at step 4 the
    restarted job's ranks each leave a child, which the run names under the job."""
    proc = run(tmp_path, "hostile_loops:leaves_a_daemon", world_sizes="2", HOSTILE_DAEMON_STEP="4")
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    result = canonical.loads((out / schema.result_file("elastic_restart_2_to_2")).read_bytes())
    assert "torchrun: left sleep running; killed when it ended" in result["warnings"]
    assert carrying(str(tmp_path)) == []
    assert verify_artifact(out).passed


def test_the_example_leaves_nothing_to_warn_about(tmp_path: Path) -> None:
    """No false warning: DataLoader-style and checkpoint processes multiprocessing ends itself
    (async_save's process mode) are not a loop's leftovers."""
    proc = run(tmp_path, "mlp_fixture:fixture", cwd=TESTS.parent / "examples")
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in proc.stdout


def test_a_loop_that_changes_directory_still_resumes_and_writes_nothing_there(
    tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = run(tmp_path, "hostile_loops:changes_directory", HOSTILE_CHDIR=str(elsewhere))
    assert proc.returncode == 0, proc.stderr
    assert list(elsewhere.iterdir()) == []
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_step_that_leaves_threads_running_is_named_as_such_not_as_a_slow_step(
    tmp_path: Path,
) -> None:
    """The first step starts 50 non-daemon threads that never end and returns at once: the
    worker cannot exit, and the timeout says so, naming the threads, instead of blaming
    "building it and taking one step"."""
    proc = run(tmp_path, "hostile_loops:leaves_threads", timeout="10")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stdout == ""
    names = ", ".join(f"never-ending-{i}" for i in range(8))
    assert proc.stderr == (
        "dcp-invariant: fail: fixture 'hostile_loops:leaves_threads': timeout: its first step() "
        f"returned, but left 50 non-daemon thread(s) running ({names} and 42 more), and a "
        "worker exits only once those end: they had not after 10 s; make them daemon threads "
        "(daemon=True) or stop and join them before step() returns\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]  # no artifact, no stage
    assert list((tmp_path / "tmp").iterdir()) == []
    if reaper.supported():
        assert carrying(str(tmp_path)) == []
