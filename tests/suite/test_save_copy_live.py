"""What an app's own save may leave that is not a checkpoint, through the real CLI: a FIFO, a
socket or a device node is refused by name without a byte read from it; a 2 GiB sparse file is
copied with its holes and an interrupt still stops the run within 2 s; a file a thread writes
after save() returned is named with its own cause (issue #46, item 3).

The loops are in ``tests/unsealable_loops.py``; each run is at world size 1 (``resume_1`` and
``half_written_1``), in a TMPDIR of its own so that what it leaves is found.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import proc_state
import pytest
import unsealable_names
from cli_runs import REVISION

from dcp_invariant import canonical

pytestmark = pytest.mark.live

TESTS = Path(__file__).resolve().parent.parent
# Far more than a run at world size 1 takes here (about 10 s); a run that reads a device without
# end is killed at it.
RUN_SECONDS = 240
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc, mknod, SEEK_DATA")
REFUSAL = "the app's save() cannot be sealed: commit: special: is a {kind}; a checkpoint may hold "
REFUSAL += "regular files and directories only"


class Run:
    """``run --fixture unsealable_loops:NAME --world-sizes 1`` in the background, in a session
    of its own, its output collected as it comes."""

    def __init__(self, tmp_path: Path, loop: str, env: dict[str, str] | None = None) -> None:
        self.tmpdir = tmp_path / "private-tmp"
        self.tmpdir.mkdir()
        self.output = tmp_path / "out"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dcp_invariant",
                "run",
                "--fixture",
                f"unsealable_loops:{loop}",
                "--world-sizes",
                "1",
                "--output-dir",
                str(self.output),
                "--source-revision",
                REVISION,
            ],
            cwd=TESTS,
            env={**os.environ, "TMPDIR": str(self.tmpdir), **(env or {})},
            start_new_session=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._readers = [
            threading.Thread(target=_read, args=(stream, into), daemon=True)
            for stream, into in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr))
        ]
        for reader in self._readers:
            reader.start()

    def finish(self, seconds: float) -> int:
        """The exit code; the run and every process it started killed if it takes longer."""
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return -1
        finally:
            if self.proc.poll() is None:
                if sys.platform == "win32":  # POSIX only: skipped there
                    raise NotImplementedError
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)
            for reader in self._readers:
                reader.join(timeout=10)
            proc_state.wait_until(lambda: not proc_state.processes_with(str(self.tmpdir)), 10)

    def text(self) -> str:
        return "".join(self.stdout) + "".join(self.stderr)

    def reasons(self, scenario: str) -> list[str]:
        result = canonical.loads((self.output / "results" / f"{scenario}.json").read_bytes())
        reasons: list[str] = result["reasons"]
        return reasons

    def commit(self, scenario: str) -> dict[str, object]:
        obs = canonical.loads((self.output / "observations" / f"{scenario}.json").read_bytes())
        commit: dict[str, object] = obs["commit"]
        return commit


def _read(stream: IO[str], into: list[str]) -> None:
    for line in stream:
        into.append(line)


def _refused_unread(run: Run, kind: str) -> None:
    """Both scenarios refuse the entry by its relative name, in the seal's words; no driver
    error, no absolute path, no traceback; the rank's own file is listed, the entry is not."""
    code = run.finish(RUN_SECONDS)
    assert code == 1, run.text()
    for scenario in ("resume_1", "half_written_1"):
        assert run.reasons(scenario)[:1] == [REFUSAL.format(kind=kind)], run.text()
        assert run.commit(scenario)["files"] == [{"path": "rank0.pt", "size": _SIZE}], run.text()
    assert "driver stopped" not in run.text()
    assert str(run.tmpdir) not in run.text()
    assert "Traceback" not in run.text()


# The size of the correct loop's own file (saving_loops.SavesItself) at world size 1.
_SIZE = 14776


def test_a_fifo_in_an_apps_save_is_refused_by_name(tmp_path: Path) -> None:
    _refused_unread(Run(tmp_path, "saves_a_fifo"), "FIFO")


def test_a_socket_in_an_apps_save_is_refused_by_name(tmp_path: Path) -> None:
    _refused_unread(Run(tmp_path, "saves_a_socket"), "socket")


@linux_only
@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0,
    reason="mknod(2) of a device needs CAP_MKNOD: run as root (as in a CI container) to check it",
)
@pytest.mark.parametrize(
    "device", [unsealable_names.NULL, unsealable_names.ZERO], ids=["null", "zero"]
)
def test_a_device_in_an_apps_save_is_refused_unread(
    tmp_path: Path, device: tuple[int, int]
) -> None:
    """/dev/null's numbers were sealed as an empty file, /dev/zero's read without end."""
    env = {"UNSEALABLE_DEVICE": f"{device[0]},{device[1]}"}
    _refused_unread(Run(tmp_path, "saves_a_device", env), "character device")


def test_a_file_written_after_save_returned_is_named_with_its_own_cause(tmp_path: Path) -> None:
    """The thread's file is there, whole, when the group ends, in every run; it is named, and the
    commit lists only what the save had written when it returned."""
    run = Run(tmp_path, "writes_after_save")
    assert run.finish(RUN_SECONDS) == 1, run.text()
    for scenario in ("resume_1", "half_written_1"):
        assert run.reasons(scenario)[:1] == [
            "written after the app's save() returned: commit: rank0-late.bin: not there when "
            "save() returned; save() must have finished writing when it returns: wait for the "
            "threads that write (or return their future, with saves_async = True)"
        ], run.text()
        assert run.commit(scenario)["files"] == [{"path": "rank0.pt", "size": _SIZE}]


def _copies(tmpdir: Path) -> list[Path]:
    """The sparse file as copied into a scenario's own workspace (not the shared group's)."""
    pattern = f"dcp-invariant-*/*/ckpt/candidates/*/{unsealable_names.SPARSE}"
    return [p for p in tmpdir.glob(pattern) if p.parts[-5] != "shared"]


def _copied_whole(tmpdir: Path) -> int | None:
    """The bytes a whole copy of the sparse file takes on disk, once one is whole."""
    for copy in _copies(tmpdir):
        try:
            st = copy.stat()
        except FileNotFoundError:
            continue
        if st.st_size == unsealable_names.SPARSE_BYTES:
            if sys.platform == "win32":  # POSIX only: skipped there
                raise NotImplementedError
            blocks: int = st.st_blocks
            return blocks * 512
    return None


@linux_only
@pytest.mark.parametrize(
    ("signum", "code", "whole"),
    [(signal.SIGINT, 130, False), (signal.SIGTERM, 143, True)],
    ids=["SIGINT-as-the-copy-starts", "SIGTERM-once-copied"],
)
def test_a_large_sparse_file_is_copied_with_its_holes_and_an_interrupt_stops_the_run(
    tmp_path: Path, signum: signal.Signals, code: int, whole: bool
) -> None:
    """The signal comes as a scenario's copy appears (its copy, seal and promotion then read
    2 GiB), or once the copy is whole, whose holes must be kept: the run stops within 2 s."""
    run = Run(tmp_path, "saves_a_sparse_file")
    try:
        if whole:
            assert proc_state.wait_until(lambda: _copied_whole(run.tmpdir) is not None, 120)
            on_disk = _copied_whole(run.tmpdir)
            assert on_disk is not None and on_disk < 64 << 20, f"{on_disk} bytes on disk"
        else:
            assert proc_state.wait_until(lambda: _copies(run.tmpdir), 120), run.text()
        run.proc.send_signal(signum)
        started = time.monotonic()
        stopped = run.finish(30)
        elapsed = time.monotonic() - started
    finally:
        run.finish(30)
    assert stopped == code, run.text()
    assert elapsed < 2.5, f"took {elapsed:.1f} s to stop; {run.text()}"
    assert run.stderr[-1].strip() == "dcp-invariant: interrupted: nothing written"
    assert not run.output.exists()
    assert proc_state.wait_until(lambda: not list(run.tmpdir.iterdir()), 10), list(
        run.tmpdir.iterdir()
    )
