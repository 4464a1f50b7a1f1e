"""Shareable groups run once per run; every scenario that asks gets the outcome and its own store."""

from __future__ import annotations

import errno
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from dcp_invariant import regular_file
from dcp_invariant.suite.pool import Cancelled, GroupOutcome
from dcp_invariant.suite.scenarios import save_copy, shared_groups
from dcp_invariant.suite.scenarios.payloads import Call
from dcp_invariant.suite.scenarios.shared_groups import SharedGroups


class RecordingPool:
    """Stands in for the worker pool: writes a store and counts the groups it was asked to run."""

    def __init__(self, release: threading.Event | None = None, fail: bool = False) -> None:
        self.calls: list[tuple[str, int, str]] = []
        self.release = release
        self.fail = fail

    def run_group(self, call: Call, world_size: int, workdir: Path, name: str) -> GroupOutcome:
        self.calls.append((call.task, world_size, workdir.name))
        if self.release is not None:
            assert self.release.wait(10)
        if self.fail:
            raise Cancelled("the run is being interrupted")
        (workdir / "ckpt" / "candidates" / "step-3").mkdir(parents=True)
        (workdir / "ckpt" / "candidates" / "step-3" / ".metadata").write_bytes(b"saved")
        return GroupOutcome(exit_codes=[0] * world_size, timed_out=False, results=[], logs=[])


def scenario_dirs(tmp_path: Path, count: int) -> list[Path]:
    dirs = [tmp_path / f"scenario-{i}" for i in range(count)]
    for d in dirs:
        d.mkdir()
    return dirs


def test_identical_groups_run_once_and_each_scenario_gets_its_own_store(tmp_path: Path) -> None:
    pool = RecordingPool()
    shared = SharedGroups(tmp_path / "shared", ("ckpt",))
    a, b = scenario_dirs(tmp_path, 2)
    first = shared.run(pool, Call("tasks:train", {"steps": 3}), 2, a, "source")  # type: ignore[arg-type]
    second = shared.run(pool, Call("tasks:train", {"steps": 3}), 2, b, "source")  # type: ignore[arg-type]
    assert pool.calls == [("tasks:train", 2, "group-1")]
    assert first is second
    (a / "ckpt" / "candidates" / "step-3" / ".metadata").unlink()  # one scenario damages its copy
    assert (b / "ckpt" / "candidates" / "step-3" / ".metadata").read_bytes() == b"saved"


@pytest.mark.parametrize(
    "other",
    [
        ("tasks:train", 1, "source", {"steps": 3}),
        ("tasks:train", 2, "source", {"steps": 4}),
        ("tasks:other", 2, "source", {"steps": 3}),
        ("tasks:train", 2, "target", {"steps": 3}),
    ],
)
def test_groups_that_differ_in_anything_run_apart(tmp_path: Path, other: tuple[Any, ...]) -> None:
    pool = RecordingPool()
    shared = SharedGroups(tmp_path / "shared", ("ckpt",))
    a, b = scenario_dirs(tmp_path, 2)
    shared.run(pool, Call("tasks:train", {"steps": 3}), 2, a, "source")  # type: ignore[arg-type]
    task, world_size, name, payload = other
    shared.run(pool, Call(task, payload), world_size, b, name)  # type: ignore[arg-type]
    assert [call[2] for call in pool.calls] == ["group-1", "group-2"]


def test_a_scenario_waits_for_the_group_another_is_running(tmp_path: Path) -> None:
    release = threading.Event()
    pool = RecordingPool(release)
    shared = SharedGroups(tmp_path / "shared", ("ckpt",))
    a, b = scenario_dirs(tmp_path, 2)
    owner = threading.Thread(
        target=shared.run, args=(pool, Call("tasks:train", {"steps": 3}), 2, a, "source")
    )
    owner.start()
    while not pool.calls:
        threading.Event().wait(0.01)
    waiter_done = threading.Event()

    def wait() -> None:
        shared.run(pool, Call("tasks:train", {"steps": 3}), 2, b, "source")  # type: ignore[arg-type]
        waiter_done.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    assert not waiter_done.wait(0.3), "the waiter must not finish before the group has run"
    release.set()
    owner.join(10)
    waiter.join(10)
    assert waiter_done.is_set()
    assert len(pool.calls) == 1
    assert (b / "ckpt" / "candidates" / "step-3" / ".metadata").exists()


def test_an_interrupted_group_interrupts_every_scenario_waiting_for_it(tmp_path: Path) -> None:
    release = threading.Event()
    pool = RecordingPool(release, fail=True)
    shared = SharedGroups(tmp_path / "shared", ("ckpt",))
    a, b = scenario_dirs(tmp_path, 2)
    raised: list[BaseException] = []

    def run(workdir: Path) -> None:
        try:
            shared.run(pool, Call("tasks:train", {}), 2, workdir, "source")  # type: ignore[arg-type]
        except Cancelled as exc:
            raised.append(exc)

    threads = [threading.Thread(target=run, args=(d,)) for d in (a, b)]
    for t in threads:
        t.start()
    release.set()
    for t in threads:
        t.join(10)
    assert len(raised) == 2
    assert len(pool.calls) == 1
    assert not (b / "ckpt").exists()


def test_a_full_disk_while_copying_keeps_its_errno(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner stops on ENOSPC (exit 2) only if the copy's error still carries it."""
    shared = SharedGroups(tmp_path / "shared", ("ckpt",))
    a, b = scenario_dirs(tmp_path, 2)
    pool = RecordingPool()
    shared.run(pool, Call("tasks:train", {}), 2, a, "source")  # type: ignore[arg-type]

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(save_copy, "copy_file", full)
    with pytest.raises(OSError) as raised:
        shared.run(pool, Call("tasks:train", {}), 2, b, "source")  # type: ignore[arg-type]
    assert raised.value.errno == errno.ENOSPC


@pytest.mark.skipif(not hasattr(os, "symlink"), reason="no symlinks")
def test_links_in_a_shared_store_are_copied_as_links(tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "generations" / "g1").mkdir(parents=True)
    (source / "generations" / "g1" / "f").write_bytes(b"x")
    try:
        (source / "file-link").symlink_to("generations/g1/f")
        (source / "dir-link").symlink_to("generations", target_is_directory=True)
    except OSError:
        pytest.skip("creating symlinks needs a privilege here")
    target = tmp_path / "target"
    shared_groups._copy_tree(source, target)
    assert (target / "generations" / "g1" / "f").read_bytes() == b"x"
    assert os.readlink(target / "file-link") == "generations/g1/f"
    assert os.readlink(target / "dir-link") == "generations"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs")
def test_a_fifo_is_left_out_unread_and_named(tmp_path: Path) -> None:
    """Opening a FIFO for reading would block until a writer came; it is left out, named by its
    path relative to the copied root, and what else the tree holds is copied."""
    source = tmp_path / "source"
    (source / "candidates" / "step-3").mkdir(parents=True)
    (source / "candidates" / "step-3" / "rank0.pt").write_bytes(b"x")
    if sys.platform == "win32":  # POSIX only: skipped there
        raise NotImplementedError
    os.mkfifo(source / "candidates" / "step-3" / "pipe")
    target = tmp_path / "target"
    refused = shared_groups._copy_tree(source, target)
    assert refused == [save_copy.Refused("candidates/step-3/pipe", "FIFO")]
    assert sorted(p.name for p in (target / "candidates" / "step-3").iterdir()) == ["rank0.pt"]


@pytest.mark.skipif(not hasattr(os, "SEEK_DATA"), reason="no SEEK_DATA")
def test_a_sparse_file_is_copied_with_its_holes_and_its_times(tmp_path: Path) -> None:
    source = tmp_path / "sparse"
    with open(source, "wb") as f:
        f.seek(256 << 20)
        f.write(b"data")
        f.truncate(512 << 20)
    os.utime(source, ns=(1, 123456789))
    save_copy.copy_file(source, tmp_path / "copy")
    st = (tmp_path / "copy").stat()
    if sys.platform == "win32":  # POSIX only: skipped there
        raise NotImplementedError
    assert st.st_size == 512 << 20 and st.st_mtime_ns == 123456789
    if source.stat().st_blocks * 512 < 1 << 20:  # the file system keeps holes at all
        assert st.st_blocks * 512 < 1 << 20
    with open(tmp_path / "copy", "rb") as f:
        f.seek(256 << 20)
        assert f.read(8) == b"data" + bytes(4)


def test_an_interruption_stops_a_copy_between_chunks(tmp_path: Path) -> None:
    source = tmp_path / "dense"
    source.write_bytes(b"x" * (4 * regular_file.CHUNK_BYTES))
    chunks: list[int] = []

    def interrupt() -> None:
        chunks.append(1)
        if len(chunks) > 2:
            raise Cancelled("the run is being interrupted")

    token = regular_file.INTERRUPTION.set(interrupt)
    try:
        with pytest.raises(Cancelled):
            save_copy.copy_file(source, tmp_path / "copy")
    finally:
        regular_file.INTERRUPTION.reset(token)
    assert (tmp_path / "copy").stat().st_size < source.stat().st_size
