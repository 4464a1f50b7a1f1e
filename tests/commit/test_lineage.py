"""Lineage: a generation names the pointer it was built on, and only a fast-forward is published."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from commit_helpers import Crash, commit, temporaries, write_candidate

from dcp_invariant import canonical
from dcp_invariant.commit import (
    CheckpointStore,
    CommitError,
    LineageError,
    StaleParent,
    StoreError,
    lineage,
    pointer,
)
from dcp_invariant.commit.lineage import Lineage
from dcp_invariant.commit.pointer import Pointer


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "store")


def sha(raw: bytes | None) -> str | None:
    return None if raw is None else hashlib.sha256(raw).hexdigest()


def candidate_lineage(store: CheckpointStore, label: str) -> Path:
    return store.candidates / f"{label}.lineage.json"


def edit(path: Path, change: Callable[[dict[str, Any]], None]) -> None:
    record = canonical.loads(path.read_bytes())
    change(record)
    path.chmod(0o644)
    path.write_bytes(canonical.dumps(record))


# --- what seal and promote record ------------------------------------------------------------


def test_seal_records_the_pointer_it_saw_as_parent(store: CheckpointStore) -> None:
    write_candidate(store, "step-1")
    first = store.seal("step-1")
    assert Lineage.decode(candidate_lineage(store, "step-1").read_bytes()) == Lineage(
        first.digest, "step-1", None, 1
    )
    store.promote("step-1")
    parent = store.pointer_bytes()
    write_candidate(store, "step-2")
    second = store.seal("step-2")
    recorded = Lineage.decode(candidate_lineage(store, "step-2").read_bytes())
    assert recorded.parent_digest == sha(parent)
    assert recorded == Lineage(second.digest, "step-2", store.read_pointer(), 2)


def test_a_generation_keeps_its_lineage_beside_it(store: CheckpointStore) -> None:
    first = commit(store, "step-1")
    parent = store.pointer_bytes()
    second = commit(store, "step-2")
    for generation, sequence, parent_digest in ((first, 1, None), (second, 2, sha(parent))):
        raw = (store.generations / f"{generation.digest}.lineage.json").read_bytes()
        recorded = Lineage.decode(raw)
        assert (recorded.generation, recorded.sequence) == (generation.digest, sequence)
        assert recorded.parent_digest == parent_digest
    assert not candidate_lineage(store, "step-2").exists()


# --- the stale parent -----------------------------------------------------------------------


@pytest.mark.parametrize("history", [0, 1], ids=["empty-store", "one-generation"])
def test_a_candidate_sealed_before_another_promotion_is_refused_as_stale(
    store: CheckpointStore, history: int
) -> None:
    previous = commit(store, "step-0") if history else None
    parent = store.pointer_bytes()
    write_candidate(store, "alpha")
    write_candidate(store, "beta")
    store.seal("alpha")
    beta = store.seal("beta")
    winner = store.promote("alpha")
    published = store.pointer_bytes()

    with pytest.raises(StaleParent) as info:
        store.promote("beta")

    assert isinstance(info.value, CommitError)
    assert (info.value.expected, info.value.actual) == (sha(parent), sha(published))
    message = str(info.value)
    assert "\n" not in message
    assert "stale parent" in message
    assert (sha(published) or "")[:12] in message
    assert (hashlib.sha256(parent).hexdigest()[:12] if parent else "none (empty store)") in message
    # The pointer is the winner's, at exactly parent + 1; the loser's generation is on disk,
    # complete and read-only, but not selected.
    assert store.pointer_bytes() == published
    assert store.resolve() == winner
    assert store.read_pointer() == Pointer("alpha", winner.digest, history + 1)
    assert beta.digest in store.generation_names()
    assert previous is None or previous.digest in store.generation_names()
    # Asking again gives the same answer: the refusal is not a transient.
    with pytest.raises(StaleParent):
        store.promote("beta")
    assert store.pointer_bytes() == published


def test_a_candidate_sealed_after_the_promotion_is_published(store: CheckpointStore) -> None:
    commit(store, "alpha")
    generation = commit(store, "beta")
    assert store.read_pointer() == Pointer("beta", generation.digest, 2)


# --- forged and inconsistent records ----------------------------------------------------------


def test_a_forged_parent_digest_is_refused(store: CheckpointStore) -> None:
    # A loser that rewrites its parent digest to the winner's pointer, to slip past the check.
    write_candidate(store, "alpha")
    write_candidate(store, "beta")
    store.seal("alpha")
    store.seal("beta")
    store.promote("alpha")
    published = store.pointer_bytes()
    path = candidate_lineage(store, "beta")
    winner = Pointer.decode(published or b"")
    edit(
        path,
        lambda r: r.update(
            parent={"generation": "a" * 64, "label": "x", "sequence": 1, "sha256": winner.digest}
        ),
    )
    with pytest.raises(LineageError, match="forged parent digest"):
        store.promote("beta")
    assert store.pointer_bytes() == published


def test_a_sequence_that_does_not_follow_its_parent_is_refused(store: CheckpointStore) -> None:
    commit(store, "step-1")
    before = store.pointer_bytes()
    write_candidate(store, "step-2")
    store.seal("step-2")
    edit(candidate_lineage(store, "step-2"), lambda r: r.update(sequence=3))
    with pytest.raises(LineageError, match="sequence 3 does not follow its parent's 1"):
        store.promote("step-2")
    assert store.pointer_bytes() == before


def test_resolve_refuses_a_generation_whose_lineage_disagrees_with_the_pointer(
    store: CheckpointStore,
) -> None:
    generation = commit(store, "step-1")
    current = store.read_pointer()
    assert current is not None
    pointer.write(store.pointer_path, Pointer("step-1", generation.digest, 7))
    with pytest.raises(LineageError, match="at sequence 7, its lineage at 1"):
        store.resolve()


def test_resolve_refuses_a_generation_without_lineage(store: CheckpointStore) -> None:
    generation = commit(store, "step-1")
    (store.generations / f"{generation.digest}.lineage.json").unlink()
    with pytest.raises(LineageError, match="lineage is missing"):
        store.resolve()


def test_one_receipt_is_not_published_again_under_a_new_lineage(store: CheckpointStore) -> None:
    # The same label and bytes give the same receipt, now sealed on another parent.
    commit(store, "step-1")
    before = store.pointer_bytes()
    write_candidate(store, "step-1")
    store.seal("step-1")
    with pytest.raises(LineageError, match="already exists under another lineage"):
        store.promote("step-1")
    assert store.pointer_bytes() == before
    assert store.candidate("step-1").is_dir()


def test_a_moved_generation_is_not_published_under_an_edited_lineage(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit(store, "step-1")
    before = store.pointer_bytes()
    write_candidate(store, "step-2")
    sealed = store.seal("step-2")
    with monkeypatch.context() as patch:
        patch.setattr(pointer, "write", lambda *a: (_ for _ in ()).throw(OSError("crash")))
        with pytest.raises(OSError):
            store.promote("step-2")
    # The interrupted promotion's seal, rewritten as if it had been sealed on an empty store.
    path = candidate_lineage(store, "step-2")
    path.write_bytes(Lineage(sealed.digest, "step-2", None, 1).encode())
    with pytest.raises(LineageError, match="already exists under another lineage"):
        store.promote("step-2")
    assert store.pointer_bytes() == before


def test_a_lineage_for_another_receipt_is_refused(store: CheckpointStore) -> None:
    write_candidate(store, "step-1")
    store.seal("step-1")
    candidate_lineage(store, "step-1").write_bytes(Lineage("c" * 64, "step-1", None, 1).encode())
    with pytest.raises(LineageError, match="not the receipt"):
        store.promote("step-1")
    assert store.pointer_bytes() is None


def test_a_seal_without_lineage_is_refused(store: CheckpointStore) -> None:
    write_candidate(store, "step-1")
    store.seal("step-1")
    candidate_lineage(store, "step-1").unlink()
    with pytest.raises(StoreError, match="without a lineage record"):
        store.promote("step-1")
    assert store.pointer_bytes() is None


PARENT = Pointer("step-1", "a" * 64, 4)
GOOD = Lineage("b" * 64, "step-2", PARENT, 5)


def good_record() -> dict[str, Any]:
    return cast(dict[str, Any], canonical.loads(GOOD.encode()))


MALFORMED: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("wrong schema", lambda r: r.update(schema="dcp-invariant/lineage/0"), "unknown schema"),
    ("extra key", lambda r: r.update(extra=1), "expected exactly the keys"),
    ("no parent, sequence 2", lambda r: r.update(parent=None), "without a parent it must be 1"),
    ("sequence skips", lambda r: r.update(sequence=6), "does not follow its parent's 4"),
    ("sequence repeats", lambda r: r.update(sequence=4), "does not follow its parent's 4"),
    ("forged digest", lambda r: r["parent"].update(sha256="0" * 64), "forged parent digest"),
    ("parent edited", lambda r: r["parent"].update(label="step-0"), "forged parent digest"),
    ("parent not a record", lambda r: r.update(parent="a" * 64), "parent must be null"),
    ("parent sequence 0", lambda r: r["parent"].update(sequence=0), "malformed parent"),
    ("generation not hex", lambda r: r.update(generation="../x"), "malformed generation"),
    ("sequence a string", lambda r: r.update(sequence="5"), "malformed generation"),
]


def test_the_malformed_table_starts_from_a_valid_record() -> None:
    assert Lineage.decode(canonical.dumps(good_record())) == GOOD
    assert GOOD.parent_digest == hashlib.sha256(PARENT.encode()).hexdigest()
    assert GOOD.pointer() == Pointer("step-2", "b" * 64, 5)


@pytest.mark.parametrize(
    ("mutate", "message"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_decode_rejects_malformed_records(
    mutate: Callable[[dict[str, Any]], None], message: str
) -> None:
    record = good_record()
    mutate(record)
    with pytest.raises(LineageError, match=message):
        Lineage.decode(canonical.dumps(record))


def test_the_lineage_schema_is_versioned() -> None:
    assert lineage.SCHEMA == "dcp-invariant/lineage/1"


# --- crash leftovers and idempotent retries ---------------------------------------------------


def crash(*args: object, **kwargs: object) -> None:
    raise Crash("the process died here")


def test_stale_temporaries_are_removed_by_the_next_operation(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_candidate(store, "step-1")
    store.seal("step-1")
    # A death during the pointer's replacement: no handler runs, so its temporary stays.
    real_replace = os.replace

    def replace(source: Any, target: Any) -> None:
        if Path(target).name == "pointer.json":
            crash()
        real_replace(source, target)

    with monkeypatch.context() as patch:
        patch.setattr(os, "replace", replace)
        patch.setattr(os, "unlink", crash)
        with pytest.raises(Crash):
            store.promote("step-1")
    left = temporaries(store.root)
    assert [Path(p).name.startswith(".pointer.json.") for p in left] == [True]
    # Leftovers of the same protocol in the other directories, and files that are not its own.
    token = "0123456789abcdef"
    ours = [
        store.candidates / f".step-9.receipt.json.{token}.tmp",
        store.candidates / f".step-9.lineage.json.{token}.tmp",
        store.generations / f".{'d' * 64}.receipt.json.{token}.tmp",
        store.candidates / "step-8.lineage.json",  # a seal that died before its receipt
    ]
    theirs = [
        store.root / f".notes.json.{token}.tmp",
        store.root / ".pointer.json.tmp",
        store.root / "pointer.json.tmp",
        store.root / "elsewhere" / f".pointer.json.{token}.tmp",
        store.generations / f".{'d' * 64}.receipt.json.short.tmp",
    ]
    (store.root / "elsewhere").mkdir()
    for path in ours + theirs:
        path.write_bytes(b"x")

    generation = store.promote("step-1")

    assert store.resolve() == generation
    assert [p for p in ours if p.exists()] == []
    assert [p for p in theirs if not p.exists()] == []


def test_seal_also_removes_stale_temporaries(store: CheckpointStore) -> None:
    store.candidates.mkdir(parents=True)
    leftover = store.root / ".pointer.json.0123456789abcdef.tmp"
    leftover.write_bytes(b"half a pointer")
    write_candidate(store, "step-1")
    store.seal("step-1")
    assert not leftover.exists()


@pytest.mark.parametrize("dies_at", ["step-1.lineage.json", "step-1.receipt.json"])
def test_a_retry_after_the_pointer_moved_publishes_once(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch, dies_at: str
) -> None:
    write_candidate(store, "step-1")
    sealed = store.seal("step-1")
    real_unlink = os.unlink

    def unlink(path: Any, *args: Any, **kwargs: Any) -> None:
        if Path(path).name == dies_at:
            raise Crash("died while removing the seal")
        real_unlink(path, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(os, "unlink", unlink)
        with pytest.raises(Crash):
            store.promote("step-1")
    published = store.pointer_bytes()
    assert store.read_pointer() == Pointer("step-1", sealed.digest, 1)

    generation = store.promote("step-1")

    assert generation.digest == sealed.digest
    assert store.pointer_bytes() == published  # not sequence 2
    assert sorted(os.listdir(store.candidates)) == []
    # And once more, with nothing of the candidate left: still the same publication.
    assert store.promote("step-1") == generation
    assert store.pointer_bytes() == published


def test_promoting_a_published_label_with_a_new_candidate_needs_a_seal(
    store: CheckpointStore,
) -> None:
    commit(store, "step-1")
    write_candidate(store, "step-1")
    with pytest.raises(StoreError, match="seal it before promoting"):
        store.promote("step-1")
