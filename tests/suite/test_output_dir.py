"""The output directory is checked, locked and staged before any scenario runs."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections import namedtuple
from pathlib import Path

import pytest

from dcp_invariant import cli
from dcp_invariant.suite import runner
from dcp_invariant.suite.output_dir import OutputDirError, Reservation

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
