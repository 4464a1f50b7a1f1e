"""The commit protocol: seal, promote, resolve, on hand-made DCP-shaped directories."""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from commit_helpers import (
    NESTED_DIRECTORIES,
    NESTED_FILES,
    SHARD0,
    SHARD1,
    commit,
    flip_byte,
    make_writable,
    symlink_or_skip,
    write_candidate,
    write_nested_candidate,
)

from dcp_invariant.commit import (
    CheckpointStore,
    Failure,
    Generation,
    PromotionRefused,
    ReceiptMismatch,
    StoreError,
    pointer,
)


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "store")


# --- promote ------------------------------------------------------------------------------


def test_promote_moves_the_sealed_candidate_and_then_the_pointer(store: CheckpointStore) -> None:
    files = write_candidate(store, "step-1")
    sealed = store.seal("step-1")
    generation = store.promote("step-1")

    target = store.generations / sealed.digest
    assert generation == Generation(target, sealed)
    assert store.read_pointer() == pointer.Pointer("step-1", sealed.digest, 1)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == files
    assert (store.generations / f"{sealed.digest}.receipt.json").read_bytes() == sealed.encode()
    assert store.generation_names() == [sealed.digest]
    assert not store.candidate("step-1").exists()
    assert not (store.candidates / "step-1.receipt.json").exists()
    assert store.resolve() == generation


def test_promoted_files_are_read_only(store: CheckpointStore) -> None:
    generation = commit(store, "step-1")
    for path in generation.path.iterdir():
        assert path.stat().st_mode & 0o222 == 0, path.name


def test_a_second_promotion_advances_the_sequence(store: CheckpointStore) -> None:
    first = commit(store, "step-1")
    second = commit(store, "step-2")
    assert second.digest != first.digest
    assert store.read_pointer() == pointer.Pointer("step-2", second.digest, 2)
    assert store.generation_names() == sorted([first.digest, second.digest])
    assert store.resolve() == second


def remove(name: str) -> Callable[[Path], None]:
    return lambda d: (d / name).unlink()


DAMAGE = [
    ("no-metadata", remove(".metadata"), Failure(".metadata", "missing")),
    ("no-shard", remove(SHARD1), Failure(SHARD1, "missing")),
    ("flipped-byte", lambda d: flip_byte(d / SHARD0), Failure(SHARD0, "digest")),
    (
        "extra-file",
        lambda d: (d / "__2_0.distcp").write_bytes(b"x"),
        Failure("__2_0.distcp", "unexpected"),
    ),
]


@pytest.mark.parametrize(("damage", "failure"), [d[1:] for d in DAMAGE], ids=[d[0] for d in DAMAGE])
def test_promote_refuses_a_candidate_damaged_after_sealing(
    store: CheckpointStore, damage: Callable[[Path], None], failure: Failure
) -> None:
    commit(store, "step-1")
    pointer_before = store.pointer_bytes()
    generations_before = store.generation_names()
    write_candidate(store, "step-2")
    store.seal("step-2")
    candidate = store.candidate("step-2")
    damage(candidate)
    left_in_candidate = sorted(os.listdir(candidate))

    with pytest.raises(PromotionRefused) as info:
        store.promote("step-2")

    assert info.value.failures == [failure]
    assert str(failure) in str(info.value)
    assert store.pointer_bytes() == pointer_before
    assert store.generation_names() == generations_before
    assert sorted(os.listdir(candidate)) == left_in_candidate
    assert (store.candidates / "step-2.receipt.json").is_file()


def test_promote_without_seal_is_refused(store: CheckpointStore) -> None:
    write_candidate(store, "step-1")
    with pytest.raises(StoreError, match="seal it before promoting"):
        store.promote("step-1")
    assert store.pointer_bytes() is None
    assert store.candidate("step-1").is_dir()


def test_promote_refuses_a_duplicate_generation(store: CheckpointStore) -> None:
    # Same label and bytes give the same receipt digest: it must not overwrite the generation.
    commit(store, "step-1")
    pointer_before = store.pointer_bytes()
    write_candidate(store, "step-1")
    store.seal("step-1")
    with pytest.raises(StoreError, match="already exists"):
        store.promote("step-1")
    assert store.pointer_bytes() == pointer_before
    assert store.candidate("step-1").is_dir()


def failing_replace(*args: object, **kwargs: object) -> None:
    raise OSError("simulated failure of os.replace")


def test_promote_can_be_retried_after_the_move_failed(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_candidate(store, "step-1")
    sealed = store.seal("step-1")
    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", failing_replace)
        with pytest.raises(OSError, match="simulated"):
            store.promote("step-1")
    assert store.pointer_bytes() is None
    assert store.candidate("step-1").is_dir()

    assert store.promote("step-1").digest == sealed.digest
    assert store.resolve().digest == sealed.digest


# --- resolve ------------------------------------------------------------------------------


def test_resolve_without_a_pointer_is_refused(store: CheckpointStore) -> None:
    with pytest.raises(StoreError, match="nothing has been promoted"):
        store.resolve()


def truncate_shard(d: Path) -> None:
    make_writable(d / SHARD1)
    with open(d / SHARD1, "r+b") as f:
        f.truncate(1)


def flip_shard(d: Path) -> None:
    make_writable(d / SHARD0)
    flip_byte(d / SHARD0)


TAMPER = [
    ("flipped-byte", flip_shard, [Failure(SHARD0, "digest")]),
    ("truncated", truncate_shard, [Failure(SHARD1, "size")]),
    ("removed", remove(".metadata"), [Failure(".metadata", "missing")]),
    ("added", lambda d: (d / "evil.pkl").write_bytes(b""), [Failure("evil.pkl", "unexpected")]),
]


@pytest.mark.parametrize(
    ("tamper", "failures"), [t[1:] for t in TAMPER], ids=[t[0] for t in TAMPER]
)
def test_resolve_refuses_a_tampered_generation(
    store: CheckpointStore, tamper: Callable[[Path], None], failures: list[Failure]
) -> None:
    generation = commit(store, "step-1")
    tamper(generation.path)
    with pytest.raises(ReceiptMismatch) as info:
        store.resolve()
    assert info.value.failures == failures
    assert str(failures[0]) in str(info.value)


def test_resolve_refuses_an_edited_generation_receipt(store: CheckpointStore) -> None:
    generation = commit(store, "step-1")
    path = store.generations / f"{generation.digest}.receipt.json"
    # A still-valid receipt, so only the digest comparison can catch it.
    path.write_bytes(path.read_bytes().replace(b'"label":"step-1"', b'"label":"step-9"'))
    with pytest.raises(StoreError, match="receipt does not match the pointer's digest"):
        store.resolve()


def test_resolve_refuses_a_missing_generation_receipt(store: CheckpointStore) -> None:
    generation = commit(store, "step-1")
    (store.generations / f"{generation.digest}.receipt.json").unlink()
    with pytest.raises(StoreError, match="receipt is missing"):
        store.resolve()


def test_resolve_refuses_a_corrupt_pointer(store: CheckpointStore) -> None:
    commit(store, "step-1")
    store.pointer_path.write_bytes(b'{"generation":"x"}\n')
    with pytest.raises(StoreError, match=r"pointer\.json is damaged"):
        store.resolve()


# --- labels -------------------------------------------------------------------------------

BAD_LABELS = ["", ".", "..", "../up", "a/b", "a\\b", ".hidden", "-x", "a b", "a\n", "é", "x" * 101]


@pytest.mark.parametrize("label", BAD_LABELS)
@pytest.mark.parametrize("operation", ["candidate", "seal", "promote"])
def test_invalid_labels_are_refused(store: CheckpointStore, operation: str, label: str) -> None:
    with pytest.raises(StoreError, match="invalid checkpoint label"):
        getattr(store, operation)(label)
    assert not store.root.exists()


@pytest.mark.parametrize("label", ["a", "step-10", "Run_2.final", "x" * 100])
def test_valid_labels_name_a_directory_under_candidates(store: CheckpointStore, label: str) -> None:
    assert store.candidate(label) == store.candidates / label


def test_sealing_twice_is_refused_and_keeps_the_first_receipt(store: CheckpointStore) -> None:
    write_candidate(store, "step-1")
    first = store.seal("step-1")
    receipt_file = store.candidates / "step-1.receipt.json"
    with pytest.raises(StoreError, match="already sealed"):
        store.seal("step-1")
    assert receipt_file.read_bytes() == first.encode()


def test_promotion_interrupted_after_the_move_completes_on_retry(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A crash between moving the generation into place and writing the pointer.
    write_candidate(store, "step-1")
    sealed = store.seal("step-1")
    with monkeypatch.context() as patch:
        patch.setattr(pointer, "write", failing_replace)
        with pytest.raises(OSError, match="simulated"):
            store.promote("step-1")
    assert store.pointer_bytes() is None
    assert not store.candidate("step-1").exists()

    assert store.promote("step-1").digest == sealed.digest
    assert store.resolve().digest == sealed.digest
    assert not (store.candidates / "step-1.receipt.json").exists()


def test_an_interrupted_promotion_whose_generation_was_damaged_is_refused(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_candidate(store, "step-1")
    sealed = store.seal("step-1")
    with monkeypatch.context() as patch:
        patch.setattr(pointer, "write", failing_replace)
        with pytest.raises(OSError):
            store.promote("step-1")
    shard = store.generations / sealed.digest / "__1_0.distcp"
    shard.chmod(0o644)
    shard.write_bytes(b"torn")
    with pytest.raises(PromotionRefused) as refused:
        store.promote("step-1")
    assert [(f.path, f.reason) for f in refused.value.failures] == [("__1_0.distcp", "size")]
    assert store.pointer_bytes() is None


def test_a_label_that_would_collide_with_a_receipt_file_is_refused(store: CheckpointStore) -> None:
    with pytest.raises(StoreError, match="invalid checkpoint label"):
        store.candidate("step-1.receipt.json")


def test_a_receipt_sealed_for_another_label_is_not_promoted(store: CheckpointStore) -> None:
    write_candidate(store, "step-1")
    write_candidate(store, "step-2")
    store.seal("step-2")
    # step-1's receipt swapped for step-2's: same protocol, wrong checkpoint.
    (store.candidates / "step-2.receipt.json").rename(store.candidates / "step-1.receipt.json")
    with pytest.raises(StoreError, match="its receipt seals 'step-2'"):
        store.promote("step-1")
    assert store.pointer_bytes() is None


def test_resolve_refuses_a_pointer_whose_label_disagrees_with_the_receipt(
    store: CheckpointStore,
) -> None:
    generation = commit(store, "step-1")
    current = store.read_pointer()
    assert current is not None
    pointer.write(
        store.pointer_path, pointer.Pointer("step-9", generation.digest, current.sequence)
    )
    with pytest.raises(StoreError, match="the pointer names 'step-9'"):
        store.resolve()


def test_the_retry_after_a_crash_leaves_the_generation_read_only(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_candidate(store, "step-1")
    sealed = store.seal("step-1")
    # The store changes modes through descriptors where it can (fchmod), else by path.
    name = "fchmod" if hasattr(os, "fchmod") else "chmod"
    real_chmod = getattr(os, name)
    with monkeypatch.context() as patch:
        # The crash lands after the move, before the files were made read-only.
        patch.setattr(os, name, lambda *args: (_ for _ in ()).throw(OSError("crash")))
        with pytest.raises(OSError, match="crash"):
            store.promote("step-1")
    assert getattr(os, name) is real_chmod
    store.promote("step-1")
    for path in (store.generations / sealed.digest).iterdir():
        assert not path.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)


# --- an app's own save, nested (marker=None) ----------------------------------------------


@pytest.fixture
def app_store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "store", marker=None)


def tree_of(root: Path) -> tuple[dict[str, bytes], list[str]]:
    """Files by relative path with their bytes, and every directory, as the generation holds them."""
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    directories = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_dir())
    return files, directories


def test_a_nested_save_is_promoted_as_the_app_wrote_it(app_store: CheckpointStore) -> None:
    """Every file at its depth and the directory the app left empty, which its load may expect."""
    files = write_nested_candidate(app_store, "step-1")
    sealed = app_store.seal("step-1")
    generation = app_store.promote("step-1")
    assert tree_of(generation.path) == (files, list(NESTED_DIRECTORIES))
    assert [f.path for f in sealed.files] == list(NESTED_FILES)
    assert app_store.resolve() == generation


@pytest.mark.skipif(sys.platform == "win32", reason="Windows gives directories no write bits")
def test_every_directory_of_a_nested_generation_is_read_only(app_store: CheckpointStore) -> None:
    generation = commit(app_store, "step-1")
    for path in [generation.path, *generation.path.rglob("*")]:
        assert path.stat().st_mode & 0o222 == 0, path


def writable(*paths: Path) -> None:
    for path in paths:
        make_writable(path)


def flip_nested(d: Path) -> None:
    writable(d / "optim" / "shards" / "__0_0.distcp")
    flip_byte(d / "optim" / "shards" / "__0_0.distcp")


def plant_in_empty(d: Path) -> None:
    writable(d / "empty")
    (d / "empty" / "evil.pkl").write_bytes(b"")


def remove_empty(d: Path) -> None:
    writable(d)
    (d / "empty").rmdir()


def model_to_symlink(d: Path) -> None:
    # The same bytes, outside the generation, behind a link: never followed.
    writable(d, d / "model")
    outside = d.parent.parent / "outside"
    (d / "model").rename(outside)
    symlink_or_skip(d / "model", outside)


NESTED_TAMPER = [
    ("flipped-byte", flip_nested, [Failure("optim/shards/__0_0.distcp", "digest")]),
    ("planted", plant_in_empty, [Failure("empty/evil.pkl", "unexpected")]),
    ("empty-dir-removed", remove_empty, [Failure("empty", "missing")]),
    (
        "dir-to-symlink",
        model_to_symlink,
        [Failure("model", "missing"), Failure("model/weights.pt", "missing")],
    ),
]


@pytest.mark.parametrize(
    ("tamper", "failures"), [t[1:] for t in NESTED_TAMPER], ids=[t[0] for t in NESTED_TAMPER]
)
def test_resolve_refuses_a_tampered_nested_generation_before_any_load(
    app_store: CheckpointStore, tamper: Callable[[Path], None], failures: list[Failure]
) -> None:
    """resolve() is what every rank calls before the app's load(): a nested file changed after
    promotion never reaches it."""
    generation = commit(app_store, "step-1")
    tamper(generation.path)
    with pytest.raises(ReceiptMismatch) as info:
        app_store.resolve()
    assert info.value.failures == failures


def test_promote_refuses_a_nested_candidate_damaged_after_sealing(
    app_store: CheckpointStore,
) -> None:
    write_nested_candidate(app_store, "step-1")
    app_store.seal("step-1")
    (app_store.candidate("step-1") / "model" / "weights.pt").write_bytes(b"rewritten")
    (app_store.candidate("step-1") / "optim" / "late").mkdir()
    with pytest.raises(PromotionRefused) as info:
        app_store.promote("step-1")
    assert info.value.failures == [
        Failure("optim/late", "unexpected"),
        Failure("model/weights.pt", "size"),
    ]
    assert app_store.read_pointer() is None
    assert app_store.generation_names() == []
