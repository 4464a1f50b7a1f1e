"""The output directory is checked, locked and staged before any scenario runs."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import namedtuple
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from proc_state import alive, wait_until

from dcp_invariant import cli
from dcp_invariant.errors import OutputDirError
from dcp_invariant.suite import output_dir, reaper, runner, workspace
from dcp_invariant.suite.output_dir import Reservation

REVISION = "a" * 40


@pytest.fixture(autouse=True)
def suite_must_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(**kwargs: object) -> None:
        raise AssertionError("reached runner.run_suite")

    monkeypatch.setattr(runner, "run_suite", refuse)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = cli.main(["run", "--source-revision", REVISION, *args])
    err = capsys.readouterr().err
    return code, err


def test_a_name_too_long_for_the_staging_directory_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(capsys, "--output-dir", str(tmp_path / ("x" * 250)))
    assert code == 2 and "leave room for its staging directory" in err
    assert len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []


def test_a_name_over_255_bytes_is_refused_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Longer than any file name can be: before the bound was checked first, a stat of it
    raised ENAMETOOLONG as a traceback."""
    code, err = run(capsys, "--output-dir", str(tmp_path / ("x" * 300)))
    assert code == 2
    assert err == (
        "dcp-invariant: error: the output directory's name is 300 bytes; at most 245 leave room "
        "for its staging directory: choose a shorter --output-dir\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_directory_on_the_way_named_over_255_bytes_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run(capsys, "--output-dir", str(tmp_path / ("y" * 300) / "out"))
    assert code == 2
    assert err == (
        "dcp-invariant: error: the output directory's path holds a name of 300 bytes "
        f"({'y' * 40!r}...), longer than a file name can be (255): choose another --output-dir\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_path_longer_than_the_os_opens_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each name is short, the whole is over PATH_MAX (4096 on Linux, 1024 on macOS)."""
    target = tmp_path.joinpath(*["z" * 200] * 25, "out")
    code, err = run(capsys, "--output-dir", str(target))
    assert code == 2
    assert err == (
        f"dcp-invariant: error: the output directory's path is {len(os.fsencode(str(target)))} "
        "bytes, longer than the OS opens: choose a shorter --output-dir\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc")
def test_a_parent_that_cannot_take_files_is_blamed_not_tmpdir(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """/proc has no free space (and is not writable but by root): the fault is the output
    directory's parent, which the user chose, not TMPDIR."""
    code, err = run(capsys, "--output-dir", "/proc/dcp-invariant-out")
    assert code == 2 and len(err.splitlines()) == 1
    assert "/proc " in err and "choose another --output-dir" in err
    assert "TMPDIR" not in err
    assert not Path("/proc/dcp-invariant-out").exists()


def test_a_parent_that_is_a_file_is_named_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_bytes(b"")
    code, err = run(capsys, "--output-dir", str(tmp_path / "file" / "out"))
    assert code == 2 and "file is not a directory" in err


@pytest.mark.parametrize("value", ["1e308", "inf", "0", "-1", "86401"])
def test_a_timeout_out_of_range_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    code, err = run(capsys, "--output-dir", str(tmp_path / "out"), "--timeout", value)
    assert code == 2 and "--timeout must be a number of seconds from 0 to 86400" in err


def test_a_deleted_working_directory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    here = os.getcwd()
    os.chdir(gone)
    try:
        gone.rmdir()
        code, err = run(capsys, "--output-dir", str(tmp_path / "out"))
    finally:
        os.chdir(here)
    assert code == 2 and "the current directory no longer exists" in err


def test_a_full_disk_is_refused_before_the_suite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 30, 1 << 30, 1 << 20))
    code, err = run(capsys, "--output-dir", str(tmp_path / "out"))
    assert code == 2
    # The parent is named as the directory at fault, and the fix is another output directory:
    # TMPDIR has nothing to do with it.
    assert err == (
        f"dcp-invariant: error: the output directory's parent {tmp_path} has 1 MiB free, the "
        "run needs 16 MiB: free space there or choose another --output-dir\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_second_reservation_of_one_directory_is_refused_and_the_first_releases(
    tmp_path: Path,
) -> None:
    target = tmp_path / "out"
    first = Reservation(target)
    with pytest.raises(OutputDirError, match="another dcp-invariant run is writing"):
        Reservation(target)
    first.release()
    second = Reservation(target)
    second.fill({"summary.json": b"{}\n"})
    second.release()
    assert (target / "summary.json").read_bytes() == b"{}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no stage, no lock left


def test_an_empty_target_directory_is_taken_and_a_filled_one_is_not(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    reservation = Reservation(target)
    (target / "late").write_bytes(b"")  # someone wrote into it while the suite ran
    with pytest.raises(FileExistsError):
        reservation.fill({"summary.json": b"{}\n"})
    reservation.release()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_filled_reservation_holds_exactly_the_files(tmp_path: Path) -> None:
    files = {"summary.json": b"{}\n", "results/a.json": b"[]\n"}
    target = tmp_path / "evidence"
    reservation = Reservation(target)
    reservation.fill(files)
    reservation.release()

    written = {
        p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()
    }
    assert written == files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evidence"]


def test_a_file_that_cannot_be_written_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "evidence"
    reservation = Reservation(target)
    with pytest.raises(OSError):
        reservation.fill({"elsewhere/file.json": b"{}\n"})  # no such subdirectory is staged
    reservation.release()

    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_parent_is_an_environment_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(*args: object, **kwargs: object) -> str:
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path))

    monkeypatch.setattr(tempfile, "mkdtemp", no_space)
    with pytest.raises(OutputDirError, match="No space left on device") as caught:
        Reservation(tmp_path / "out")
    assert str(caught.value).endswith("or choose another --output-dir")
    assert "TMPDIR" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


# --- a dead run's lock and staging directory --------------------------------------------------

# A run in a process of its own: it reserves argv[1] (relative to its working directory, as
# `--output-dir evidence` is), prints its staging directory's name (and, with a guardian, the
# guardian's PID), then dies by SIGKILL ("die", "guarded") or holds the reservation until its
# stdin closes ("hold").
HOLDER = """
import os, signal, sys
from pathlib import Path
from dcp_invariant.suite.output_dir import Reservation
from dcp_invariant.suite.reaper import Guardian

reservation = Reservation(Path(sys.argv[1]))
assert reservation.stage is not None
if sys.argv[2] == "guarded":
    guardian = Guardian().__enter__()
    guardian.release_if_killed(reservation.lock_path)
    assert guardian.pid is not None
    print(reservation.stage.name, guardian.pid, flush=True)
else:
    print(reservation.stage.name, flush=True)
if sys.argv[2] in ("die", "guarded"):
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.read()
reservation.release()
"""
HOLDER_TIMEOUT = 60


# A run killed by SIGKILL, which Windows lacks (its TerminateProcess is what the lock's release
# by the OS already covers there).
posix_only = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILLs a run: POSIX only")


def killed_run(parent: Path, name: str, mode: str = "die") -> list[str]:
    """Reserve ``parent / name`` in a process SIGKILLed at once (``mode`` "die", or "guarded"
    with a guardian); what it printed: its staging directory's name, and the guardian's PID."""
    if sys.platform == "win32":  # every caller is skipped there (posix_only): this is for mypy
        raise AssertionError("SIGKILL is POSIX")
    proc = subprocess.run(
        [sys.executable, "-c", HOLDER, name, mode],
        cwd=parent,
        capture_output=True,
        text=True,
        timeout=HOLDER_TIMEOUT,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    return proc.stdout.split()


@contextlib.contextmanager
def live_run(parent: Path, name: str) -> Iterator[str]:
    """A run holding ``parent / name``'s reservation while the block runs; it releases it and
    exits after. Yields its staging directory's name."""
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, name, "hold"],
        cwd=parent,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        stage = proc.stdout.readline().strip()
        assert stage, proc.stderr.read() if proc.stderr else ""
        yield stage
        _, err = proc.communicate(timeout=HOLDER_TIMEOUT)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=HOLDER_TIMEOUT)


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@posix_only
def test_the_next_run_into_a_killed_runs_output_dir_removes_its_lock_and_stage(
    tmp_path: Path,
) -> None:
    [stage] = killed_run(tmp_path, "out")
    # What issue #28 found beside the output directory long after the run was killed.
    assert names(tmp_path) == sorted([".out.lock", stage])
    record = (tmp_path / ".out.lock").read_bytes()
    assert record.startswith(output_dir.RECORD_HEADER) and f"stage {stage[5:]}\n" in record.decode()
    # Beside it, what is not provably ours stays: another tool's lock, a lock file that is a
    # symlink, and a directory named like a stage of ours that is neither recorded nor empty.
    (tmp_path / ".other.lock").write_bytes(b"held by another tool\n")
    (tmp_path / ".link.lock").symlink_to(tmp_path / ".other.lock")
    lookalike = tmp_path / ".out.abcdefgh"
    lookalike.mkdir()
    (lookalike / "notes.txt").write_bytes(b"mine\n")

    reservation = Reservation(tmp_path / "out")
    assert reservation.stage is not None and reservation.stage.name != stage
    assert not (tmp_path / stage).exists()
    reservation.fill({"summary.json": b"{}\n"})
    reservation.release()

    assert names(tmp_path) == [".link.lock", ".other.lock", ".out.abcdefgh", "out"]
    assert (tmp_path / ".other.lock").read_bytes() == b"held by another tool\n"
    assert (lookalike / "notes.txt").read_bytes() == b"mine\n"


@posix_only
def test_a_run_beside_a_killed_runs_output_dir_removes_its_lock_and_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    killed_run(tmp_path, "evidence")
    assert len(names(tmp_path)) == 2
    # `run` into another directory of the same parent: the reservation is made (and the dead
    # run's leftovers removed) before the suite would start.
    with pytest.raises(AssertionError, match=r"reached runner\.run_suite"):
        run(capsys, "--output-dir", str(tmp_path / "evidence-2"))
    assert names(tmp_path) == []


def test_a_lock_left_by_an_older_version_is_taken_with_its_empty_stage(tmp_path: Path) -> None:
    """Before the lock kept a record it was an empty file; the stage of a run killed before
    its end is empty."""
    (tmp_path / ".out.lock").write_bytes(b"")
    (tmp_path / ".out.k3j4h5g6").mkdir()
    reservation = Reservation(tmp_path / "out")
    assert reservation.stage is not None
    assert names(tmp_path) == sorted([".out.lock", reservation.stage.name])
    reservation.release()
    assert names(tmp_path) == []


def test_a_live_runs_lock_and_stage_are_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output_dir, "LOCK_WAIT", 0.2)
    with live_run(tmp_path, "out") as stage:
        lock = tmp_path / ".out.lock"
        before = (lock.stat().st_ino, lock.read_bytes())
        with pytest.raises(OutputDirError, match="another dcp-invariant run is writing"):
            Reservation(tmp_path / "out")
        assert output_dir.clear_if_dead(lock) is False
        beside = Reservation(tmp_path / "beside")  # sweeps the parent: the live lock stays
        beside.release()
        assert names(tmp_path) == sorted([".out.lock", stage])
        assert (lock.stat().st_ino, lock.read_bytes()) == before
    assert names(tmp_path) == []  # the run released its reservation


def test_a_lock_cleared_after_it_was_opened_is_taken_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever clears a dead lock removes its file; a run that had opened it just before must
    not lock the removed file while another run locks a new one at the same path."""
    monkeypatch.setattr(output_dir, "LOCK_WAIT", 0.2)
    lock = tmp_path / ".out.lock"
    taken: list[IO[bytes]] = []
    real = workspace.lock_exclusive

    def cleared_first(handle: IO[bytes]) -> None:
        if not taken:
            lock.unlink()  # cleared by a guardian, then taken by another run
            taken.append(open(lock, "wb"))  # noqa: SIM115 (closed below)
            real(taken[0])
        real(handle)

    monkeypatch.setattr(output_dir, "lock_exclusive", cleared_first)
    try:
        with pytest.raises(OutputDirError, match="another dcp-invariant run is writing"):
            Reservation(tmp_path / "out")
    finally:
        for handle in taken:
            handle.close()
    lock.unlink()
    assert names(tmp_path) == []


@pytest.mark.skipif(not reaper.supported(), reason="the guardian reads /proc")
def test_after_a_sigkill_the_guardian_removes_the_lock_and_stage(tmp_path: Path) -> None:
    if sys.platform == "win32":  # skipped there (reaper.supported()): this is for mypy
        raise AssertionError("the guardian is Linux only")
    stage, pid = killed_run(tmp_path, "evidence", "guarded")
    assert stage.startswith(".evidence.")  # reserved when the runner was killed
    guardian = int(pid)
    try:
        assert wait_until(lambda: names(tmp_path) == [], 5.0), names(tmp_path)
        assert wait_until(lambda: not alive(guardian), 5.0)
    finally:
        if alive(guardian):
            os.kill(guardian, signal.SIGKILL)
        # Ours to reap only if this process is a subreaper (PR_SET_CHILD_SUBREAPER, prctl(2)).
        with contextlib.suppress(ChildProcessError):
            os.waitpid(guardian, os.WNOHANG)
