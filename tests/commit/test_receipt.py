"""Receipts: sealing a finished DCP directory, and every way a directory can stop matching."""

from __future__ import annotations

import hashlib
import os
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from commit_helpers import flip_byte, symlink_or_skip

from dcp_invariant import canonical, dcp_layout, regular_file
from dcp_invariant.commit import Failure, ReceiptError, ReceiptMismatch, SealError, receipt
from dcp_invariant.commit.receipt import FileEntry, Receipt

FILES = {
    ".metadata": b"metadata-bytes",
    "__0_0.distcp": b"rank zero shard" * 3,
    "__1_0.distcp": b"rank one shard",
}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    directory = tmp_path / "ckpt"
    directory.mkdir()
    for name, data in FILES.items():
        (directory / name).write_bytes(data)
    return directory


# --- seal ---------------------------------------------------------------------------------


def test_seal_records_sorted_entries_with_size_and_sha256(ckpt: Path) -> None:
    sealed = receipt.seal(ckpt, "step-3")
    assert sealed.label == "step-3"
    assert sealed.files == tuple(
        FileEntry(name, len(data), sha(data)) for name, data in sorted(FILES.items())
    )


def test_seal_refuses_an_unfinished_save(ckpt: Path) -> None:
    (ckpt / ".metadata").unlink()
    with pytest.raises(SealError, match=r"no \.metadata; the save did not finish"):
        receipt.seal(ckpt, "step-3")


def test_a_save_without_a_marker_is_sealed_as_it_is_unless_it_wrote_nothing(ckpt: Path) -> None:
    """An app's own save ends when every rank's save() returned (the driver knows): no file of
    its own marks it, but an empty directory is no checkpoint."""
    (ckpt / ".metadata").unlink()
    sealed = receipt.seal(ckpt, "step-3", marker=None)
    assert ".metadata" not in {f.path for f in sealed.files} and sealed.files
    for entry in ckpt.iterdir():
        entry.unlink()
    with pytest.raises(SealError, match=r"^step-3: the save wrote no file, so there is nothing"):
        receipt.seal(ckpt, "step-3", marker=None)
    for i in range(dcp_layout.MAX_FILES + 1):
        (ckpt / f"part{i}").touch()
    with pytest.raises(SealError, match=r"^step-3: the save wrote 4097 files; a checkpoint may"):
        receipt.seal(ckpt, "step-3", marker=None)


def make_fifo(path: Path) -> None:
    if sys.platform == "win32":  # the test is skipped there: this is for mypy
        pytest.skip("no FIFOs on Windows")
    os.mkfifo(path)


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        # Windows needs a privilege for symlinks: skipped cleanly where it is missing.
        (lambda p: symlink_or_skip(p, Path("__0_0.distcp")), "symlink"),
        (lambda p: p.mkdir(), "directory"),
        pytest.param(
            make_fifo,
            "FIFO",
            marks=pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on Windows"),
        ),
    ],
    ids=["symlink", "directory", "fifo"],
)
def test_seal_refuses_entries_that_are_not_regular_files(
    ckpt: Path, make: Callable[[Path], None], kind: str
) -> None:
    # Even a symlink to a file inside the checkpoint is refused: its target could change later.
    make(ckpt / "odd")
    with pytest.raises(SealError, match=f"^odd: is a {kind};"):
        receipt.seal(ckpt, "step-3")


def test_seal_refuses_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(SealError, match="does not exist"):
        receipt.seal(tmp_path / "absent", "step-3")


# --- check --------------------------------------------------------------------------------


def remove(name: str) -> Callable[[Path], None]:
    return lambda d: (d / name).unlink()


def truncate(d: Path) -> None:
    with open(d / "__0_0.distcp", "r+b") as f:
        f.truncate(5)


def append(d: Path) -> None:
    with open(d / "__1_0.distcp", "ab") as f:
        f.write(b"\0")


def to_symlink(d: Path) -> None:
    # Same bytes behind the link: the entry kind alone must be enough to fail.
    (d / "copy").write_bytes(FILES["__1_0.distcp"])
    (d / "__1_0.distcp").unlink()
    symlink_or_skip(d / "__1_0.distcp", Path("copy"))


DAMAGE = [
    ("missing-metadata", remove(".metadata"), [Failure(".metadata", "missing")]),
    ("missing-shard", remove("__1_0.distcp"), [Failure("__1_0.distcp", "missing")]),
    ("unexpected", lambda d: (d / "extra").write_bytes(b""), [Failure("extra", "unexpected")]),
    ("unexpected-dir", lambda d: (d / "sub").mkdir(), [Failure("sub", "unexpected")]),
    ("truncated", truncate, [Failure("__0_0.distcp", "size")]),
    ("appended", append, [Failure("__1_0.distcp", "size")]),
    ("flipped", lambda d: flip_byte(d / "__0_0.distcp", 7), [Failure("__0_0.distcp", "digest")]),
    (
        "symlink",
        to_symlink,
        [Failure("copy", "unexpected"), Failure("__1_0.distcp", "not a regular file")],
    ),
]


@pytest.mark.parametrize(
    ("damage", "expected"), [d[1:] for d in DAMAGE], ids=[d[0] for d in DAMAGE]
)
def test_check_names_the_file_and_the_reason(
    ckpt: Path, damage: Callable[[Path], None], expected: list[Failure]
) -> None:
    sealed = receipt.seal(ckpt, "step-3")
    damage(ckpt)
    assert receipt.check(ckpt, sealed) == expected


def test_check_of_an_untouched_directory_is_empty(ckpt: Path) -> None:
    assert receipt.check(ckpt, receipt.seal(ckpt, "step-3")) == []


def test_check_reports_every_failure_not_just_the_first(ckpt: Path) -> None:
    sealed = receipt.seal(ckpt, "step-3")
    (ckpt / ".metadata").unlink()
    flip_byte(ckpt / "__0_0.distcp")
    append(ckpt)
    (ckpt / "zz").write_bytes(b"x")
    assert receipt.check(ckpt, sealed) == [
        Failure("zz", "unexpected"),
        Failure(".metadata", "missing"),
        Failure("__0_0.distcp", "digest"),
        Failure("__1_0.distcp", "size"),
    ]


def test_check_of_a_vanished_directory_reports_it_missing(ckpt: Path, tmp_path: Path) -> None:
    sealed = receipt.seal(ckpt, "step-3")
    ckpt.rename(tmp_path / "elsewhere")
    assert receipt.check(ckpt, sealed) == [Failure(".", "missing")]


def test_verify_raises_with_every_failure(ckpt: Path) -> None:
    sealed = receipt.seal(ckpt, "step-3")
    (ckpt / "__1_0.distcp").unlink()
    flip_byte(ckpt / ".metadata")
    with pytest.raises(ReceiptMismatch) as info:
        receipt.verify(ckpt, sealed, what="candidate step-3")
    assert info.value.failures == [
        Failure(".metadata", "digest"),
        Failure("__1_0.distcp", "missing"),
    ]
    assert str(info.value) == (
        "candidate step-3 does not match its receipt: .metadata: digest; __1_0.distcp: missing"
    )


# --- encode / decode ----------------------------------------------------------------------


def test_decode_round_trips_encode(ckpt: Path) -> None:
    sealed = receipt.seal(ckpt, "step-3")
    raw = sealed.encode()
    assert canonical.loads(raw) == sealed.to_record()
    assert Receipt.decode(raw) == sealed
    assert sealed.digest == sha(raw)


def good_record() -> dict[str, Any]:
    return {
        "files": [
            {"path": ".metadata", "sha256": "a" * 64, "size": 3},
            {"path": "__0_0.distcp", "sha256": "b" * 64, "size": 0},
        ],
        "label": "step-3",
        "schema": receipt.SCHEMA,
    }


def entry(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(record: dict[str, Any]) -> None:
        record["files"][1].update(changes)

    return mutate


MALFORMED: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("wrong schema", lambda r: r.update(schema="dcp-invariant/receipt/2")),
    ("extra top-level key", lambda r: r.update(extra=1)),
    ("missing key", lambda r: r.pop("label")),
    ("label not a string", lambda r: r.update(label=3)),
    ("files not a list", lambda r: r.update(files={})),
    ("unsorted entries", lambda r: r["files"].reverse()),
    ("duplicate entries", lambda r: r["files"].append(dict(r["files"][1]))),
    ("path with slash", entry(path="sub/__0_0.distcp")),
    ("path is ..", entry(path="..")),
    ("path is empty", entry(path="")),
    ("path with backslash", entry(path="a\\b")),
    ("negative size", entry(size=-1)),
    ("boolean size", entry(size=True)),
    ("string size", entry(size="3")),
    ("uppercase hex", entry(sha256="B" * 64)),
    ("short hex", entry(sha256="b" * 63)),
    ("non-hex", entry(sha256="g" * 64)),
    ("extra entry key", entry(mode=420)),
    ("entry not an object", lambda r: r["files"].append("zz")),
]


def test_the_malformed_table_starts_from_a_valid_record() -> None:
    # Otherwise every row below could pass for a reason unrelated to its mutation.
    assert Receipt.decode(canonical.dumps(good_record())).label == "step-3"


@pytest.mark.parametrize("mutate", [m[1] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_decode_rejects_malformed_records(mutate: Callable[[dict[str, Any]], None]) -> None:
    record = good_record()
    mutate(record)
    with pytest.raises(ReceiptError, match=r"^receipt: "):
        Receipt.decode(canonical.dumps(record))


@pytest.mark.parametrize(
    "raw",
    [
        canonical.dumps(good_record()).rstrip(b"\n"),
        canonical.dumps(good_record()).replace(b'":', b'": '),
        b"[]\n",
        b"not json\n",
    ],
    ids=["no-lf", "spaced", "not-an-object", "not-json"],
)
def test_decode_rejects_non_canonical_bytes(raw: bytes) -> None:
    with pytest.raises(ReceiptError, match=r"^receipt: "):
        Receipt.decode(raw)


# --- hash_file ----------------------------------------------------------------------------


def test_hash_file_handles_a_partial_last_chunk(tmp_path: Path) -> None:
    data = bytes(range(256)) * (regular_file.CHUNK_BYTES // 256) + b"tail"
    path = tmp_path / "f"
    path.write_bytes(data)
    assert receipt.hash_file(path) == (len(data), sha(data))


def test_hash_file_of_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty"
    path.write_bytes(b"")
    assert receipt.hash_file(path) == (0, sha(b""))


def test_hash_file_streams_in_bounded_memory(tmp_path: Path) -> None:
    mib = 1 << 20
    size = 256 * mib
    path = tmp_path / "sparse"
    with open(path, "wb") as f:
        f.truncate(size)

    tracemalloc.start()
    try:
        result = receipt.hash_file(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    expected = hashlib.sha256()
    zeros = bytes(mib)
    for _ in range(size // mib):
        expected.update(zeros)
    assert result == (size, expected.hexdigest())
    assert peak < 4 * mib, f"hash_file peaked at {peak / mib:.1f} MiB"


@pytest.mark.skipif(sys.platform != "linux", reason="needs a file system that keeps raw byte names")
def test_undecodable_file_names_are_refused_at_seal_and_reported_printably(tmp_path: Path) -> None:
    directory = tmp_path / "candidate"
    directory.mkdir()
    (directory / ".metadata").write_bytes(b"m")
    sealed = receipt.seal(directory, "x")
    with open(os.path.join(os.fsencode(directory), b"\xff.distcp"), "wb"):
        pass
    with pytest.raises(SealError, match="not valid UTF-8"):
        receipt.seal(directory, "x")
    [failure] = receipt.check(directory, sealed)
    assert (failure.path, failure.reason) == ("'\\udcff.distcp'", "unexpected")
    # Failures end up in canonical evidence, which must be able to encode them.
    canonical.dumps(failure.to_record())
