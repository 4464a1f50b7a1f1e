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
    assert code == 2 and "has 1 MiB free, the run needs 16 MiB" in err
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
    with pytest.raises(OutputDirError, match="No space left on device"):
        Reservation(tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
