"""The one bounded, no-follow reader: what it refuses, including entries swapped after the check."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from dcp_invariant import regular_file

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
needs_nofollow = pytest.mark.skipif(not regular_file.NOFOLLOW, reason="no O_NOFOLLOW here")


def test_reads_a_regular_file_across_chunks(tmp_path: Path) -> None:
    data = os.urandom(regular_file.CHUNK_BYTES + 17)
    (tmp_path / "f").write_bytes(data)
    assert regular_file.read(tmp_path / "f") == data
    assert [len(c) for c in regular_file.chunks(tmp_path / "f")] == [regular_file.CHUNK_BYTES, 17]


def test_a_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        regular_file.read(tmp_path / "absent")


def test_a_symlink_is_refused_not_followed(tmp_path: Path) -> None:
    (tmp_path / "target").write_bytes(b"secret")
    try:
        (tmp_path / "link").symlink_to(tmp_path / "target")
    except OSError:
        pytest.skip("cannot create symlinks here")
    with pytest.raises(regular_file.NotRegularFile) as caught:
        regular_file.read(tmp_path / "link")
    assert caught.value.kind == "symlink"


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(regular_file.NotRegularFile) as caught:
        regular_file.read(tmp_path)
    assert caught.value.kind == "directory"


@needs_fifo
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    if sys.platform == "win32":  # needs_fifo skips it there; this tells mypy
        return
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(regular_file.NotRegularFile) as caught:
        regular_file.read(tmp_path / "fifo")
    assert caught.value.kind == "FIFO"


def _looks_regular(monkeypatch: pytest.MonkeyPatch, size: int = 0) -> None:
    """``lstat`` sees a regular file: the entry is swapped after the check, before the open."""
    regular = os.stat_result((0o100644, 0, 0, 1, 0, 0, size, 0, 0, 0))
    monkeypatch.setattr(os, "lstat", lambda path: regular)


@needs_fifo
def test_a_fifo_swapped_in_after_the_check_is_refused_without_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if sys.platform == "win32":
        return
    os.mkfifo(tmp_path / "fifo")
    _looks_regular(monkeypatch)
    with pytest.raises(regular_file.NotRegularFile) as caught:
        regular_file.read(tmp_path / "fifo")
    assert caught.value.kind == "FIFO"


@needs_nofollow
def test_a_symlink_swapped_in_after_the_check_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "target").write_bytes(b"secret")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    _looks_regular(monkeypatch)
    with pytest.raises(regular_file.NotRegularFile) as caught:
        regular_file.read(tmp_path / "link")
    assert caught.value.kind == "symlink"


def test_a_file_over_the_bound_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 11)
    assert regular_file.read(tmp_path / "f", bound=11) == b"x" * 11
    with pytest.raises(regular_file.OverBound) as caught:
        regular_file.read(tmp_path / "f", bound=10)
    assert (caught.value.bound, caught.value.grew) == (10, False)


def test_a_file_that_grows_past_the_bound_while_read_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "f").write_bytes(b"x" * 3 * regular_file.CHUNK_BYTES)
    real_fstat = os.fstat

    def small(fd: int) -> os.stat_result:  # the size fstat saw, before the file grew
        st = real_fstat(fd)
        return os.stat_result((st.st_mode, 0, 0, 1, 0, 0, 5, 0, 0, 0))

    monkeypatch.setattr(os, "fstat", small)
    with pytest.raises(regular_file.OverBound) as caught:
        regular_file.read(tmp_path / "f", bound=regular_file.CHUNK_BYTES)
    assert caught.value.grew
