"""A store under hostile conditions: files changed mid-promotion, symlinks, FIFOs, wrong kinds.

Each refusal is the store's own one-line error, and none of them moves the pointer.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from commit_helpers import SHARD0, SHARD1, commit, flip_byte, symlink_or_skip, write_candidate

from dcp_invariant.commit import (
    CheckpointStore,
    Failure,
    PromotionRefused,
    SealError,
    StoreError,
    durable,
)

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX file modes")


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "store")


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


# --- the final place is what is verified ------------------------------------------------------


Hooks = dict[str, list[Callable[[Path, Path], None]]]


@pytest.fixture
def moves(monkeypatch: pytest.MonkeyPatch) -> Hooks:
    """Hooks run just ``before`` and just ``after`` the candidate's move into generations/."""
    hooks: Hooks = {"before": [], "after": []}
    for name in ("rename", "replace"):  # whichever the store moves a directory with
        real = getattr(os, name)

        def move(source: Any, target: Any, *a: Any, _real: Any = real, **kw: Any) -> None:
            moving = Path(source).parent.name == "candidates" and Path(source).is_dir()
            for hook in hooks["before"] if moving else []:
                hook(Path(source), Path(target))
            _real(source, target, *a, **kw)
            for hook in hooks["after"] if moving else []:
                hook(Path(source), Path(target))

        monkeypatch.setattr(os, name, move)
    return hooks


def test_a_file_changed_between_the_check_and_the_move_is_not_published(
    store: CheckpointStore, moves: Hooks
) -> None:
    previous = commit(store, "step-1")
    before = store.pointer_bytes()
    write_candidate(store, "step-2")
    sealed = store.seal("step-2")
    moves["before"].append(lambda source, target: flip_byte(source / SHARD0))

    with pytest.raises(PromotionRefused) as info:
        store.promote("step-2")

    assert info.value.failures == [Failure(SHARD0, "digest")]
    assert "the pointer was not moved" in one_line(info.value)
    assert store.pointer_bytes() == before
    assert store.resolve() == previous
    # Refused in its final place: it stays there, unselected, and is refused again on a retry.
    assert sealed.digest in store.generation_names()
    moves["before"].clear()
    with pytest.raises(PromotionRefused):
        store.promote("step-2")
    assert store.pointer_bytes() == before


@pytest.mark.skipif(sys.platform == "win32", reason="Windows cannot rename a directory in use")
def test_a_write_through_a_handle_opened_before_promotion_is_not_published(
    store: CheckpointStore, moves: Hooks
) -> None:
    previous = commit(store, "step-1")
    before = store.pointer_bytes()
    write_candidate(store, "step-2")
    store.seal("step-2")
    with open(store.candidate("step-2") / SHARD1, "r+b") as handle:
        # A writer that kept its file open: neither the move nor the lock-down stops it.
        def write_late(source: Path, target: Path) -> None:
            handle.seek(0)
            handle.write(b"late")
            handle.flush()

        moves["after"].append(write_late)
        with pytest.raises(PromotionRefused) as info:
            store.promote("step-2")
    assert info.value.failures == [Failure(SHARD1, "digest")]
    assert store.pointer_bytes() == before
    assert store.resolve() == previous


@posix_only
def test_a_generation_and_its_files_are_read_only(store: CheckpointStore) -> None:
    generation = commit(store, "step-1")
    assert stat.S_IMODE(generation.path.stat().st_mode) & 0o222 == 0
    for path in generation.path.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) & 0o222 == 0, path.name


# --- symlinks -------------------------------------------------------------------------------


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory outside the store, shaped like a finished DCP save."""
    directory = tmp_path / "outside" / "step-1"
    directory.mkdir(parents=True)
    for name, data in {".metadata": b"m", SHARD0: b"zero", SHARD1: b"one"}.items():
        (directory / name).write_bytes(data)
        (directory / name).chmod(0o644)
    return directory


def modes(directory: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in [directory, *directory.iterdir()]}


def test_seal_refuses_a_symlinked_candidate(store: CheckpointStore, outside: Path) -> None:
    store.candidates.mkdir(parents=True)
    symlink_or_skip(store.candidate("step-1"), outside)
    with pytest.raises(SealError, match=r"^candidates/step-1 is a symlink;") as info:
        store.seal("step-1")
    one_line(info.value)
    assert sorted(os.listdir(store.candidates)) == ["step-1"]


def test_seal_refuses_a_symlinked_candidates_directory(
    store: CheckpointStore, outside: Path
) -> None:
    store.root.mkdir()
    symlink_or_skip(store.candidates, outside.parent)
    with pytest.raises(SealError, match=r"^candidates is a symlink;"):
        store.seal("step-1")
    assert sorted(os.listdir(outside.parent)) == ["step-1"]


def test_promote_refuses_a_candidate_swapped_for_a_symlink_and_chmods_nothing_outside(
    store: CheckpointStore, outside: Path
) -> None:
    files = write_candidate(store, "step-1")
    store.seal("step-1")
    # The sealed candidate's bytes, moved outside and linked back under its name.
    for name, data in files.items():
        (outside / name).write_bytes(data)
    (outside / SHARD1).write_bytes(files[SHARD1])
    for path in store.candidate("step-1").iterdir():
        path.unlink()
    store.candidate("step-1").rmdir()
    symlink_or_skip(store.candidate("step-1"), outside)
    outside_modes = modes(outside)

    with pytest.raises(StoreError, match=r"^candidates/step-1 is a symlink;") as info:
        store.promote("step-1")

    one_line(info.value)
    assert modes(outside) == outside_modes
    assert store.pointer_bytes() is None
    assert store.generation_names() == []


def test_promote_refuses_a_candidates_directory_swapped_for_a_symlink(
    store: CheckpointStore, outside: Path
) -> None:
    write_candidate(store, "step-1")
    store.seal("step-1")
    store.candidates.rename(outside.parent / "moved")
    symlink_or_skip(store.candidates, outside.parent / "moved")
    with pytest.raises(StoreError, match=r"^candidates is a symlink;"):
        store.promote("step-1")
    assert store.pointer_bytes() is None


def test_resolve_refuses_a_generation_swapped_for_a_symlink(
    store: CheckpointStore, tmp_path: Path
) -> None:
    generation = commit(store, "step-1")
    generation.path.chmod(0o755)
    generation.path.rename(tmp_path / "elsewhere")
    symlink_or_skip(generation.path, tmp_path / "elsewhere")
    with pytest.raises(StoreError, match="is a symlink"):
        store.resolve()


# --- FIFOs and other kinds where a file belongs ----------------------------------------------


def bounded(call: Callable[[], Any], fifo: Path, seconds: float = 10.0) -> BaseException | None:
    """Run ``call``; if it is still blocked after ``seconds``, release it through the FIFO and fail.

    Opening the FIFO's other end lets a reader stuck in ``open`` go on, so a hang becomes a
    test failure instead of a test run that never ends.
    """
    if sys.platform == "win32":  # every caller is skipped there (needs_fifo): this is for mypy
        pytest.skip("no FIFOs on Windows")
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        thread.join(seconds)
        pytest.fail(f"blocked on the FIFO at {fifo.name} for {seconds} s")
    return outcome[0]


def with_fifo_at(path: Path) -> Path:
    if sys.platform == "win32":  # every caller is skipped there (needs_fifo): this is for mypy
        pytest.skip("no FIFOs on Windows")
    if path.exists():
        path.chmod(0o644)
        path.unlink()
    os.mkfifo(path)
    return path


@needs_fifo
@pytest.mark.parametrize("operation", ["resolve", "read_pointer", "pointer_bytes", "promote"])
def test_a_fifo_at_the_pointer_is_refused_without_blocking(
    store: CheckpointStore, operation: str
) -> None:
    commit(store, "step-1")
    write_candidate(store, "step-2")
    store.seal("step-2")
    fifo = with_fifo_at(store.pointer_path)
    call = getattr(store, operation)
    error = bounded(lambda: call("step-2") if operation == "promote" else call(), fifo)
    assert isinstance(error, StoreError), error
    assert one_line(error) == "pointer.json is a FIFO, not a regular file; remove it"


@needs_fifo
@pytest.mark.parametrize("record", ["receipt", "lineage"])
def test_a_fifo_at_a_candidate_record_is_refused_without_blocking(
    store: CheckpointStore, record: str
) -> None:
    write_candidate(store, "step-1")
    store.seal("step-1")
    fifo = with_fifo_at(store.candidates / f"step-1.{record}.json")
    error = bounded(lambda: store.promote("step-1"), fifo)
    assert isinstance(error, StoreError), error
    assert f"candidates/step-1.{record}.json is a FIFO" in one_line(error)
    assert store.pointer_bytes() is None


@needs_fifo
def test_seal_names_a_fifo_at_the_receipt_path(store: CheckpointStore) -> None:
    write_candidate(store, "step-1")
    fifo = with_fifo_at(store.candidates / "step-1.receipt.json")
    error = bounded(lambda: store.seal("step-1"), fifo)
    assert isinstance(error, StoreError), error
    assert "step-1.receipt.json is a FIFO" in one_line(error)


@needs_fifo
@pytest.mark.parametrize("record", ["receipt", "lineage"])
def test_a_fifo_at_a_generation_record_is_refused_without_blocking(
    store: CheckpointStore, record: str
) -> None:
    generation = commit(store, "step-1")
    fifo = with_fifo_at(store.generations / f"{generation.digest}.{record}.json")
    error = bounded(store.resolve, fifo)
    assert isinstance(error, StoreError), error
    assert "is a FIFO" in one_line(error)


@needs_fifo
def test_a_fifo_in_place_of_a_sealed_file_is_refused_at_promotion(
    store: CheckpointStore,
) -> None:
    write_candidate(store, "step-1")
    store.seal("step-1")
    fifo = with_fifo_at(store.candidate("step-1") / SHARD0)
    error = bounded(lambda: store.promote("step-1"), fifo)
    assert isinstance(error, PromotionRefused), error
    assert error.failures == [Failure(SHARD0, "not a regular file")]


@pytest.mark.parametrize(
    "operation", ["resolve", "read_pointer", "pointer_bytes", "promote", "seal"]
)
def test_a_directory_at_the_pointer_is_the_stores_error(
    store: CheckpointStore, operation: str
) -> None:
    write_candidate(store, "step-1")
    store.pointer_path.mkdir()
    call = getattr(store, operation)
    if operation == "promote":
        store.pointer_path.rmdir()
        store.seal("step-1")
        store.pointer_path.mkdir()
    with pytest.raises(StoreError, match=r"^pointer\.json is a directory, not a regular file"):
        call("step-1") if operation in ("promote", "seal") else call()


def test_a_pointer_over_the_record_bound_is_refused_unread(store: CheckpointStore) -> None:
    write_candidate(store, "step-1")
    store.seal("step-1")
    store.promote("step-1")
    # Sparse: the size is what counts, and nothing is read to learn it.
    with open(store.pointer_path, "r+b") as f:
        f.truncate(durable.MAX_RECORD_BYTES + 1)
    with pytest.raises(StoreError, match=r"^pointer\.json is over \d+ bytes, so this protocol"):
        store.resolve()


@pytest.mark.parametrize(
    "operation", ["resolve", "read_pointer", "pointer_bytes", "promote", "seal"]
)
def test_a_store_root_that_is_a_file_is_the_stores_error(tmp_path: Path, operation: str) -> None:
    root = tmp_path / "store"
    root.write_bytes(b"not a directory")
    store = CheckpointStore(root)
    call = getattr(store, operation)
    with pytest.raises(StoreError, match=r"is a regular file, not a directory$") as info:
        call("step-1") if operation in ("promote", "seal") else call()
    one_line(info.value)
    assert store.generation_names() == []
