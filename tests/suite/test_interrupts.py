"""Interrupts and a broken environment: the runner stops fast, leaves nothing, writes nothing.

Each run gets a TMPDIR of its own; every process the run starts (fork server, workers, the
torchrun agent and its workers) carries that path in its environment, so a process left behind
is found by it, whichever session it put itself in.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import proc_state
import pytest

from dcp_invariant.suite import pool, workspace

pytestmark = pytest.mark.live

TESTS = Path(__file__).resolve().parent.parent
REVISION = "0123456789abcdef0123456789abcdef01234567"
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


class Run:
    """The CLI in the background, its stdout (verdicts) and stderr collected as they come."""

    def __init__(
        self, tmp_path: Path, *args: str, start_method: str | None = None, cwd: Path = TESTS
    ) -> None:
        self.tmpdir = tmp_path / "private-tmp"
        self.tmpdir.mkdir(exist_ok=True)
        self.output = tmp_path / "out"
        # PYTHONFAULTHANDLER: a run that is slow to stop is sent SIGABRT, and prints where each
        # of its threads was (https://docs.python.org/3/library/faulthandler.html).
        env = {**os.environ, "TMPDIR": str(self.tmpdir), "PYTHONFAULTHANDLER": "1"}
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
            cwd=cwd,
            env=env,
            # A process group of its own, as a shell gives a job: a terminal's Ctrl-C reaches
            # the whole group (os.killpg), not only the runner.
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=self._read, args=(stream, into), daemon=True)
            for stream, into in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr))
        ]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream: IO[str], into: list[str]) -> None:
        for line in stream:
            into.append(line)

    def wait_for(self, text: str, seconds: float = 120) -> None:
        """Until a verdict line (stdout) holds ``text``."""
        assert proc_state.wait_until(lambda: any(text in line for line in self.stdout), seconds), (
            self.stdout
        )

    def wait_for_torchrun(self, seconds: float = 120) -> None:
        """Until the torchrun job's ranks run (its scenario may be the first to finish, so not
        after any scenario has passed)."""
        assert proc_state.wait_until(
            lambda: proc_state.torchrun_ranks_with(str(self.tmpdir)), seconds
        ), self.stderr

    def finish(self, seconds: float) -> int:
        try:
            return self.proc.wait(timeout=seconds)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=30)
            for reader in self._readers:
                reader.join(timeout=10)

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
    tmp_path: Path, signum: signal.Signals, code: int, start_method: str | None
) -> None:
    run = Run(tmp_path, start_method=start_method)
    run.wait_for_torchrun()
    run.proc.send_signal(signum)
    started = time.monotonic()
    # What is still running when the deadline passes, should the run be slow to stop; and
    # where each of the runner's threads waits, which its fault handler prints as it aborts.
    late: list[str] = []

    def too_late() -> None:
        if proc_state.alive(run.proc.pid):  # not yet reaped, the PID is still the runner's
            late.extend(proc_state.describe(proc_state.processes_with(str(run.tmpdir))))
            run.proc.send_signal(signal.SIGABRT)

    watcher = threading.Timer(2.5, too_late)
    watcher.start()
    stopped = run.finish(seconds=30)
    elapsed = time.monotonic() - started
    watcher.cancel()
    assert not late, f"not stopped after 2.5 s: {late}; {''.join(run.stderr)}"
    assert stopped == code, "".join(run.stderr)
    assert elapsed < 2.5, f"took {elapsed:.1f} s to stop; {run.stderr[-5:]}"
    assert run.stderr[-1].strip() == "dcp-invariant: interrupted: nothing written"
    assert "Traceback" not in "".join(run.stderr)
    assert not run.output.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    assert proc_state.wait_until(lambda: not proc_state.processes_with(str(run.tmpdir)), 2.0), (
        proc_state.processes_with(str(run.tmpdir))
    )
    assert run.leftovers() == []


@linux_only
def test_after_sigkill_the_children_follow_and_the_next_run_sweeps_the_workspace(
    tmp_path: Path,
) -> None:
    before = socket_holders()
    run = Run(tmp_path)
    run.wait_for_torchrun()
    run.proc.kill()
    run.finish(seconds=30)
    assert proc_state.wait_until(lambda: not proc_state.processes_with(str(run.tmpdir)), 2.5), (
        proc_state.processes_with(str(run.tmpdir))
    )
    # The runner ran no cleanup; its guardian removed the workspace and multiprocessing's
    # directory once every process was gone, and the short directory that held the latter.
    assert proc_state.wait_until(lambda: not list(run.tmpdir.iterdir()), SETTLE), list(
        run.tmpdir.iterdir()
    )
    assert proc_state.wait_until(lambda: not stray_socket_holders(before), SETTLE), (
        stray_socket_holders(before)
    )
    # And the output directory's lock and staging directory (issue #28): its parent holds what
    # it held before the run, and no output directory, the run having been killed.
    assert proc_state.wait_until(lambda: beside_output(run) == [], SETTLE), beside_output(run)
    assert not run.output.exists()


def beside_output(run: Run) -> list[str]:
    """What the output directory's parent holds but the run's TMPDIR and its output directory."""
    parent = run.output.parent
    return sorted(p.name for p in parent.iterdir() if p not in (run.tmpdir, run.output))


# How long a test waits for what a run leaves on disk to go once its processes are gone: the
# guardian removes it after it sees the last one die, and on a loaded machine (another test's
# run beside this one) that may take seconds. The promises about processes keep their bounds.
SETTLE = 10.0


def socket_holders() -> set[Path]:
    """The short directories runs make for multiprocessing's socket when TMPDIR is long
    (``_short_socket_directory`` in dcp_invariant/suite/workspace.py)."""
    prefix = workspace.SOCKET_HOLDER_PREFIX
    return {p for d in ("/tmp", "/var/tmp") for p in Path(d).glob(f"{prefix}*")}


def stray_socket_holders(before: set[Path]) -> set[Path]:
    """Of the socket directories made since ``before``, those whose process is gone.

    /tmp is shared: another test's run, or another pytest-xdist worker, makes and removes its
    own, and a process keeps its directory until it exits. Each is named for the process that
    owns it (``dcpi-<pid>-...``), so only a dead process's directory is a leftover.
    """
    stray = set()
    for holder in socket_holders() - before:
        owner = workspace.socket_holder_owner(holder)
        if owner is None or not proc_state.alive(owner):
            stray.add(holder)
    return stray


@linux_only
def test_a_second_run_into_the_same_output_dir_is_refused_at_once(tmp_path: Path) -> None:
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


def test_a_long_tmpdir_still_starts_the_fork_server(tmp_path: Path) -> None:
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


# --- a fixture run, interrupted at seeded moments ----------------------------------------------

# (start method, seconds a full run of the example takes here, moments per signal). The moments
# spread over the whole run: the probe, the torchrun job, async_save's process mode and its
# checkpoint processes, the last scenarios and the artifact's writing. The spawn path's moments
# cost a fresh interpreter per worker each (about 17 CPU-s a moment): one per signal, three in
# all, in three seeded phases of its run; the fork server's three per signal, nine in all, fall
# early, midway and late in each signal's run.
PATHS = {"forkserver": (8.5, 3), "spawn": (28.0, 1)}
SEED = 15
EXAMPLE = [
    "--fixture",
    "mlp_fixture:fixture",
    "--world-sizes",
    "1,2",
]


def moments(start_method: str, signame: str) -> list[float]:
    """Seeded moments, one in each of ``count`` equal slices of the run: a few moments still
    reach its early, middle and late phases."""
    length, count = PATHS[start_method]
    rng = random.Random(f"{SEED}-{start_method}-{signame}")
    width = (length - 0.3) / count
    return [round(rng.uniform(0.3 + i * width, 0.3 + (i + 1) * width), 2) for i in range(count)]


def interrupt(run: Run, signame: str) -> None:
    if sys.platform == "win32":  # the tests that interrupt are linux_only: this is for mypy
        pytest.skip("no process groups on Windows")
    if signame == "SIGINT":
        os.killpg(run.proc.pid, signal.SIGINT)  # Ctrl-C at a terminal: the whole job
    else:
        run.proc.send_signal(getattr(signal, signame))  # a CI runner's cancel, or kill -9


@linux_only
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGKILL"])
@pytest.mark.parametrize("start_method", sorted(PATHS))
def test_a_fixture_run_interrupted_at_any_moment_leaves_nothing(
    tmp_path: Path, start_method: str, signame: str
) -> None:
    """Each moment: exit 130/143 within 2 s with one line and no traceback, or after SIGKILL
    every process gone within 2.5 s; no process, workspace, ``pymp-*`` or output left. Every
    survivor is named with its command line."""
    if sys.platform == "win32":  # linux_only: this is for mypy, which does not read the mark
        pytest.skip("reads /proc")
    failures = []
    interrupted = 0
    holders = socket_holders()
    for i, moment in enumerate(moments(start_method, signame)):
        where = tmp_path / f"at-{i}"
        where.mkdir()
        run = Run(where, *EXAMPLE, start_method=start_method, cwd=TESTS.parent / "examples")
        time.sleep(moment)
        if run.proc.poll() is not None:  # the run ended before the signal: nothing to interrupt
            run.finish(seconds=30)
            continue
        interrupt(run, signame)
        interrupted += 1
        started = time.monotonic()
        code = run.finish(seconds=30)
        elapsed = time.monotonic() - started
        settle = 2.5 if signame == "SIGKILL" else 2.0
        gone = proc_state.wait_until(
            lambda r=run: not proc_state.processes_with(str(r.tmpdir)), settle
        )
        survivors = proc_state.describe(proc_state.processes_with(str(run.tmpdir)))
        for pid in proc_state.processes_with(str(run.tmpdir)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        emptied = proc_state.wait_until(lambda r=run: not list(r.tmpdir.iterdir()), SETTLE)
        left = [] if emptied else sorted(p.name for p in run.tmpdir.iterdir())
        if not proc_state.wait_until(lambda: not stray_socket_holders(holders), SETTLE):
            left += sorted(str(p) for p in stray_socket_holders(holders))
        # Beside the output directory: its lock and staging directory, gone too.
        if not proc_state.wait_until(lambda r=run: beside_output(r) == [], SETTLE):
            left += beside_output(run)
        text = "".join(run.stderr)
        label = f"{start_method} {signame} at {moment} s"
        if not gone:
            failures.append(f"{label}: survivors {survivors}")
        if left:
            failures.append(f"{label}: left {left}")
        if run.output.exists():
            failures.append(f"{label}: the output directory was written")
        if signame == "SIGKILL":
            continue
        expected = 128 + getattr(signal, signame)
        if code != expected or elapsed >= 2.0:
            failures.append(f"{label}: exit {code} after {elapsed:.2f} s, expected {expected}")
        if "Traceback" in text or run.stderr[-1:] != [
            "dcp-invariant: interrupted: nothing written\n"
        ]:
            failures.append(f"{label}: stderr ended {run.stderr[-3:]}")
    assert not failures, "\n".join(failures)
    # A run faster than planned ends before late moments: all but one must still have cut it
    # short, and at least one.
    assert interrupted >= max(1, len(moments(start_method, signame)) - 1)
