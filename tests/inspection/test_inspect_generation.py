"""A dcp-invariant generation and a sealed candidate checked against their receipts."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from inspect_data import make_checkpoint

from dcp_invariant.commit import CheckpointStore
from dcp_invariant.inspection import generation, inspect_checkpoint


def promoted(tmp_path: Path) -> Path:
    store = CheckpointStore(tmp_path / "store")
    make_checkpoint(store.candidate("step-1"), 2)
    store.seal("step-1")
    return store.promote("step-1").path


def writable(path: Path) -> None:
    path.chmod(path.stat().st_mode | stat.S_IWUSR)


def test_a_promoted_generation_matches_its_receipt(tmp_path: Path) -> None:
    directory = promoted(tmp_path)
    report = inspect_checkpoint(directory)
    assert report.problems == ()
    assert report.receipt is not None
    assert (report.receipt.kind, report.receipt.label, report.receipt.files) == (
        "generation",
        "step-1",
        3,
    )
    assert report.receipt.receipt_sha256 == directory.name


def test_a_changed_byte_of_a_generation_is_caught_by_its_sha256(tmp_path: Path) -> None:
    directory = promoted(tmp_path)
    shard = directory / "__1_0.distcp"
    writable(directory)
    writable(shard)
    data = bytearray(shard.read_bytes())
    data[100] ^= 1  # same size: only the receipt can tell
    shard.write_bytes(bytes(data))
    report = inspect_checkpoint(directory)
    assert [str(p) for p in report.problems] == [
        "receipt mismatch: __1_0.distcp: its SHA-256 differs from the receipt's"
    ]


def test_an_added_and_a_removed_file_are_caught(tmp_path: Path) -> None:
    directory = promoted(tmp_path)
    writable(directory)
    (directory / "notes.txt").write_bytes(b"x")
    os.unlink(directory / "__0_0.distcp")
    said = [str(p) for p in inspect_checkpoint(directory).problems]
    assert "receipt mismatch: notes.txt: not listed by the receipt" in said
    assert "receipt mismatch: __0_0.distcp: listed by the receipt, missing" in said
    assert any(p.startswith("missing file: __0_0.distcp") for p in said)


def test_a_receipt_that_is_not_the_generations_name_is_caught(tmp_path: Path) -> None:
    directory = promoted(tmp_path)
    receipt = directory.parent / f"{directory.name}.receipt.json"
    writable(receipt)
    receipt.write_bytes(receipt.read_bytes().replace(b"step-1", b"step-2"))
    said = [str(p) for p in inspect_checkpoint(directory).problems]
    assert len(said) == 1 and said[0].startswith(f"receipt mismatch: {receipt.name}: its SHA-256")


def test_a_malformed_receipt_is_named(tmp_path: Path) -> None:
    directory = promoted(tmp_path)
    receipt = directory.parent / f"{directory.name}.receipt.json"
    writable(receipt)
    receipt.write_bytes(b"{}")
    (problem,) = [str(p) for p in inspect_checkpoint(directory).problems]
    assert problem.startswith(f"receipt: {receipt.name}: receipt: not canonical JSON")


def test_a_sealed_candidate_is_checked_against_its_receipt(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "store")
    directory = make_checkpoint(store.candidate("step-1"), 1)
    assert generation.check(directory) is None  # not sealed yet: no receipt to check
    store.seal("step-1")
    os.truncate(directory / "__0_0.distcp", 10)
    report = inspect_checkpoint(directory)
    assert report.receipt is not None and report.receipt.kind == "candidate"
    said = [str(p) for p in report.problems]
    assert "receipt mismatch: __0_0.distcp: its size differs from the receipt's" in said
    assert any(p.startswith("truncated: __0_0.distcp holds 10 bytes") for p in said)


@pytest.mark.parametrize("name", ["0" * 64, "ckpt"])
def test_a_plain_directory_has_no_receipt(tmp_path: Path, name: str) -> None:
    directory = make_checkpoint(tmp_path / name, 1)
    assert generation.check(directory) is None


def test_a_nested_generation_of_an_apps_own_save_is_checked_by_relative_path(
    tmp_path: Path,
) -> None:
    """An app's own save, a tree (no .metadata, so DCP's side of inspect has nothing to read):
    its receipt check walks every directory, the empty one included."""
    store = CheckpointStore(tmp_path / "store", marker=None)
    candidate = store.candidate("step-1")
    (candidate / "model").mkdir(parents=True)
    (candidate / "empty").mkdir()
    (candidate / "model" / "weights.pt").write_bytes(b"weights")
    store.seal("step-1")
    directory = store.promote("step-1").path
    checked = generation.check(directory)
    assert checked is not None and (checked.files, checked.problems) == (1, ())

    writable(directory)
    writable(directory / "model")
    (directory / "empty").rmdir()
    (directory / "model" / "notes.txt").write_bytes(b"x")
    checked = generation.check(directory)
    assert checked is not None
    assert [str(p) for p in checked.problems] == [
        "receipt mismatch: model/notes.txt: not listed by the receipt",
        "receipt mismatch: empty: listed by the receipt, missing",
    ]
