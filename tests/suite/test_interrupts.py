"""Interrupts and a broken environment: the runner stops fast, leaves nothing, writes nothing.

Each run gets a TMPDIR of its own; every process the run starts (fork server, workers, the
torchrun agent and its workers) carries that path in its environment, so a process left behind
is found by it, whichever session it put itself in.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dcp_invariant.suite import pool, workspace

pytestmark = pytest.mark.live

TESTS = Path(__file__).resolve().parent.parent
REVISION = "0123456789abcdef0123456789abcdef01234567"
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


def processes_with(marker: str) -> list[int]:
    """PIDs whose environment mentions ``marker`` (this test's private TMPDIR)."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def describe(pids: list[int]) -> list[str]:
    """Each process's PID, parent, state and command line, for a failure message."""
    out = []
    for pid in pids:
        try:
            status = dict(
                line.split(":\t", 1)
                for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if ":\t" in line
            )
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:160]
        except OSError:
            continue
        out.append(f"{pid} ppid={status.get('PPid')} {status.get('State')} {command.decode()}")
    return out


def torchrun_ranks_with(marker: str) -> list[int]:
    """Of :func:`processes_with`, the torchrun job's ranks."""
    found = []
    for pid in processes_with(marker):
        try:
            if b"elastic_rank" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


class Run:
    """The CLI in the background, its stderr collected as it comes."""

    def __init__(self, tmp_path: Path, *args: str, start_method: str | None = None) -> None:
        self.tmpdir = tmp_path / "private-tmp"
        self.tmpdir.mkdir(exist_ok=True)
        self.output = tmp_path / "out"
        env = {**os.environ, "TMPDIR": str(self.tmpdir)}
        if start_method is not None:
            env[pool.START_METHOD_ENV] = start_method
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dcp_invariant",
                "run",
                "--output-dir",
                str(self.output),
                "--source-revision",
                REVISION,
                *args,
            ],
            cwd=TESTS,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def wait_for(self, text: str, seconds: float = 120) -> None:
        assert wait_until(lambda: any(text in line for line in self.stderr), seconds), self.stderr

    def wait_for_torchrun(self, seconds: float = 120) -> None:
        """Until the torchrun job's ranks run, and some scenario has finished."""
        self.wait_for("pass ", seconds)
        assert wait_until(lambda: torchrun_ranks_with(str(self.tmpdir)), seconds), self.stderr

    def finish(self, seconds: float) -> int:
        try:
            return self.proc.wait(timeout=seconds)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=30)
            self._reader.join(timeout=10)

    def leftovers(self) -> list[str]:
        return sorted(p.name for p in self.tmpdir.iterdir() if not p.name.startswith("pymp-"))


@linux_only
@pytest.mark.parametrize(
    ("signum", "code", "start_method"),
    [
        (signal.SIGINT, 130, None),
        (signal.SIGTERM, 143, None),
        # Spawned standbys may be in the middle of importing torch: they must go too.
        (signal.SIGTERM, 143, "spawn"),
    ],
)
def test_a_signal_stops_the_run_within_two_seconds_leaving_nothing(
    tmp_path, signum, code, start_method
) -> None:
    run = Run(tmp_path, start_method=start_method)
    run.wait_for_torchrun()
    run.proc.send_signal(signum)
    started = time.monotonic()
    # What is still running when the deadline passes, should the run be slow to stop.
    late: list[str] = []
    watcher = threading.Timer(2.5, lambda: late.extend(describe(processes_with(str(run.tmpdir)))))
    watcher.start()
    assert run.finish(seconds=30) == code, "".join(run.stderr)
    elapsed = time.monotonic() - started
    watcher.cancel()
    assert elapsed < 2.5, f"took {elapsed:.1f} s to stop; at 2.5 s: {late}; {run.stderr[-5:]}"
    assert run.stderr[-1].strip() == "dcp-invariant: interrupted: nothing written"
    assert "Traceback" not in "".join(run.stderr)
    assert not run.output.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    assert wait_until(lambda: not processes_with(str(run.tmpdir)), 2.0), processes_with(
        str(run.tmpdir)
    )
    assert run.leftovers() == []


@linux_only
def test_after_sigkill_the_children_follow_and_the_next_run_sweeps_the_workspace(tmp_path) -> None:
    run = Run(tmp_path)
    run.wait_for_torchrun()
    run.proc.kill()
    run.finish(seconds=30)
    assert wait_until(lambda: not processes_with(str(run.tmpdir)), 2.5), processes_with(
        str(run.tmpdir)
    )
    stale = [p for p in run.tmpdir.iterdir() if p.name.startswith(workspace.PREFIX)]
    assert stale, "a killed runner cannot clean up: its workspace must still be there"
    assert workspace.sweep_stale(run.tmpdir) == stale
    assert [p for p in run.tmpdir.iterdir() if p.name.startswith(workspace.PREFIX)] == []


@linux_only
def test_a_second_run_into_the_same_output_dir_is_refused_at_once(tmp_path) -> None:
    first = Run(tmp_path)
    first.wait_for("pass ")
    second = subprocess.run(
        [
            sys.executable,
            "-m",
            "dcp_invariant",
            "run",
            "--output-dir",
            str(first.output),
            "--source-revision",
            REVISION,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    first.proc.send_signal(signal.SIGINT)
    first.finish(seconds=30)
    assert second.returncode == 2, second.stderr
    assert "another dcp-invariant run is writing" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1


def test_a_long_tmpdir_still_starts_the_fork_server(tmp_path) -> None:
    deep = tmp_path / ("d" * 40) / ("e" * 40)
    deep.mkdir(parents=True)
    assert len(str(deep)) > 92
    proc = subprocess.run(
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
            "fixture_loops:correct",
            "--world-sizes",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=TESTS,
        env={**os.environ, "TMPDIR": str(deep)},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert [p for p in deep.iterdir() if not p.name.startswith("pymp-")] == []
