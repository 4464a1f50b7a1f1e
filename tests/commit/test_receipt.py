"""Receipts: sealing a finished DCP directory, and every way a directory can stop matching."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
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


# --- an app's own save: a tree (marker=None) ------------------------------------------------

TREE = {
    "meta.json": b"{}",
    "model/weights.pt": b"weights" * 5,
    "optim/state.pt": b"optimizer state",
    "optim/shards/__0_0.distcp": b"shard",
}
# "empty": a directory the app made and left empty, which its load may expect.
TREE_DIRECTORIES = ("empty", "model", "optim", "optim/shards")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    directory = tmp_path / "tree"
    for sub in TREE_DIRECTORIES:
        (directory / sub).mkdir(parents=True)
    for name, data in TREE.items():
        (directory / name).write_bytes(data)
    return directory


def test_seal_of_a_tree_lists_every_file_and_every_directory(tree: Path) -> None:
    sealed = receipt.seal(tree, "step-3", marker=None)
    assert sealed.files == tuple(
        FileEntry(name, len(data), sha(data)) for name, data in sorted(TREE.items())
    )
    assert sealed.directories == TREE_DIRECTORIES
    record = canonical.loads(sealed.encode())
    assert record["schema"] == receipt.SCHEMA_NESTED
    assert record["directories"] == list(TREE_DIRECTORIES)
    assert Receipt.decode(sealed.encode()) == sealed
    assert receipt.check(tree, sealed) == []


def test_a_flat_receipt_is_written_as_before_trees_were_sealed(ckpt: Path) -> None:
    """Schema /1, no directories key: every digest DCP's saves had stays what it was."""
    sealed = receipt.seal(ckpt, "step-3")
    assert sealed.directories == ()
    entries = ",".join(
        f'{{"path":"{name}","sha256":"{sha(data)}","size":{len(data)}}}'
        for name, data in sorted(FILES.items())
    )
    expected = f'{{"files":[{entries}],"label":"step-3","schema":"dcp-invariant/receipt/1"}}\n'
    assert sealed.encode() == expected.encode()
    # The same save sealed as an app's own is the same receipt: nesting costs a flat save nothing.
    assert receipt.seal(ckpt, "step-3", marker=None).encode() == sealed.encode()


def test_a_dcp_save_stays_flat(tree: Path) -> None:
    """DCP writes no subdirectory (FileSystemWriter puts every file in its path), so with its
    marker a directory is refused as before."""
    (tree / ".metadata").write_bytes(b"m")
    with pytest.raises(SealError, match=r"^empty: is a directory; a checkpoint may hold regular"):
        receipt.seal(tree, "step-3")


def _fifo_in(directory: Path) -> None:
    make_fifo(directory / "model" / "pipe")


@pytest.mark.parametrize(
    ("make", "shown", "kind"),
    [
        (
            lambda d: symlink_or_skip(d / "model" / "link", Path("weights.pt")),
            "model/link",
            "symlink",
        ),
        (
            lambda d: symlink_or_skip(d / "optim" / "to-model", Path("../model")),
            "optim/to-model",
            "symlink",
        ),
        (lambda d: symlink_or_skip(d / "up", d.parent), "up", "symlink"),
        pytest.param(
            _fifo_in,
            "model/pipe",
            "FIFO",
            marks=pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on Windows"),
        ),
    ],
    ids=["symlink-to-file", "symlink-to-directory", "symlink-outside", "fifo"],
)
def test_seal_of_a_tree_refuses_what_is_neither_file_nor_directory_at_any_depth(
    tree: Path, make: Callable[[Path], None], shown: str, kind: str
) -> None:
    make(tree)
    with pytest.raises(SealError) as info:
        receipt.seal(tree, "step-3", marker=None)
    assert str(info.value) == (
        f"{shown}: is a {kind}; a checkpoint may hold regular files and directories only"
    )


@pytest.mark.skipif(sys.platform == "win32", reason="no Unix sockets in the file system here")
def test_seal_of_a_tree_refuses_a_socket() -> None:
    if sys.platform == "win32":  # skipped there: this is for mypy
        pytest.skip("no Unix sockets")
    # A socket's path must fit in sun_path (108 bytes): pytest's tmp_path may not.
    with tempfile.TemporaryDirectory(dir="/tmp") as short:
        root = Path(short)
        (root / "a").mkdir()
        (root / "a" / "w.pt").write_bytes(b"w")
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(root / "a" / "s"))
            with pytest.raises(SealError, match=r"^a/s: is a socket; a checkpoint may hold"):
                receipt.seal(root, "step-3", marker=None)


def test_seal_of_a_tree_refuses_directories_nested_past_the_bound(tmp_path: Path) -> None:
    root = tmp_path / "deep"
    deepest = root.joinpath(*[f"d{i}" for i in range(receipt.MAX_DEPTH)])
    deepest.mkdir(parents=True)
    (deepest / "w.pt").write_bytes(b"w")
    sealed = receipt.seal(root, "step-3", marker=None)
    assert len(sealed.directories) == receipt.MAX_DEPTH
    assert Receipt.decode(sealed.encode()) == sealed  # the deepest a seal writes, decode reads
    (deepest / "one-more").mkdir()
    with pytest.raises(SealError) as info:
        receipt.seal(root, "step-3", marker=None)
    assert str(info.value) == (
        "/".join(f"d{i}" for i in range(receipt.MAX_DEPTH))
        + "/one-more: a directory 17 levels deep; a checkpoint's directories may nest at most "
        "16 levels"
    )


def test_seal_of_a_tree_counts_files_and_directories_at_every_depth(tree: Path) -> None:
    # Directories alone are no checkpoint.
    for name in TREE:
        (tree / name).unlink()
    with pytest.raises(SealError, match=r"^step-3: the save wrote no file, so there is nothing"):
        receipt.seal(tree, "step-3", marker=None)
    for i in range(dcp_layout.MAX_FILES + 1):
        (tree / ("model" if i % 2 else "optim/shards") / f"part{i}").touch()
    with pytest.raises(SealError, match=r"^step-3: the save wrote 4097 files; a checkpoint may"):
        receipt.seal(tree, "step-3", marker=None)


def test_seal_of_a_tree_bounds_its_directories(tree: Path) -> None:
    for i in range(receipt.MAX_DIRECTORIES + 1 - len(TREE_DIRECTORIES)):
        (tree / "empty" / f"d{i}").mkdir()
    with pytest.raises(SealError) as info:
        receipt.seal(tree, "step-3", marker=None)
    assert str(info.value) == (
        "step-3: the save made 4097 directories; a checkpoint may hold at most 4096"
    )


@pytest.mark.skipif(sys.platform != "linux", reason="needs a file system that keeps raw byte names")
@pytest.mark.parametrize(
    ("name", "message"),
    [
        (b"\xff.pt", r"^'model/\\udcff\.pt': file name is not valid UTF-8"),
        (b"a\\b.pt", r"^model/a\\b\.pt: a name with a backslash or a drive"),
    ],
    ids=["undecodable", "backslash"],
)
def test_seal_of_a_tree_refuses_names_a_receipt_cannot_hold(
    tree: Path, name: bytes, message: str
) -> None:
    with open(os.path.join(os.fsencode(tree / "model"), name), "wb"):
        pass
    with pytest.raises(SealError, match=message):
        receipt.seal(tree, "step-3", marker=None)


@pytest.mark.skipif(sys.platform == "win32", reason="Windows refuses ':' in a file name")
def test_seal_refuses_a_name_that_is_a_drive_on_windows(tree: Path) -> None:
    (tree / "C:x").write_bytes(b"")
    with pytest.raises(SealError, match=r"^C:x: a name with a backslash or a drive \(C:\) would"):
        receipt.seal(tree, "step-3", marker=None)


def _replace_file_with_directory(d: Path) -> None:
    (d / "model" / "weights.pt").unlink()
    (d / "model" / "weights.pt").mkdir()
    (d / "model" / "weights.pt" / "inside").write_bytes(b"weights")


def _replace_directory_with_file(d: Path) -> None:
    (d / "optim" / "shards" / "__0_0.distcp").unlink()
    (d / "optim" / "shards").rmdir()
    (d / "optim" / "shards").write_bytes(b"shard")


def _replace_directory_with_symlink(d: Path) -> None:
    # The same bytes behind the link, outside the checkpoint: never followed, so missing.
    outside = d.parent / "outside"
    (d / "model").rename(outside)
    symlink_or_skip(d / "model", outside)


def _replace_nested_file_with_symlink(d: Path) -> None:
    (d / "optim" / "state.pt").rename(d.parent / "state.pt")
    symlink_or_skip(d / "optim" / "state.pt", d.parent / "state.pt")


NESTED_DAMAGE = [
    (
        "missing-file",
        lambda d: (d / "optim" / "state.pt").unlink(),
        [Failure("optim/state.pt", "missing")],
    ),
    ("missing-empty-dir", lambda d: (d / "empty").rmdir(), [Failure("empty", "missing")]),
    (
        "missing-dir",
        lambda d: shutil.rmtree(d / "optim" / "shards"),
        [Failure("optim/shards", "missing"), Failure("optim/shards/__0_0.distcp", "missing")],
    ),
    (
        "unexpected-file",
        lambda d: (d / "empty" / "stray.pt").write_bytes(b""),
        [Failure("empty/stray.pt", "unexpected")],
    ),
    (
        "unexpected-dir",
        lambda d: (d / "optim" / "shards" / "more").mkdir(),
        [Failure("optim/shards/more", "unexpected")],
    ),
    (
        "truncated",
        lambda d: (d / "model" / "weights.pt").write_bytes(TREE["model/weights.pt"][:-1]),
        [Failure("model/weights.pt", "size")],
    ),
    (
        "flipped",
        lambda d: flip_byte(d / "optim" / "shards" / "__0_0.distcp", 1),
        [Failure("optim/shards/__0_0.distcp", "digest")],
    ),
    (
        "file-to-dir",
        _replace_file_with_directory,
        [Failure("model/weights.pt", "not a regular file")],
    ),
    (
        "dir-to-file",
        _replace_directory_with_file,
        [Failure("optim/shards", "missing"), Failure("optim/shards/__0_0.distcp", "missing")],
    ),
    (
        "dir-to-symlink",
        _replace_directory_with_symlink,
        [Failure("model", "missing"), Failure("model/weights.pt", "missing")],
    ),
    (
        "file-to-symlink",
        _replace_nested_file_with_symlink,
        [Failure("optim/state.pt", "not a regular file")],
    ),
]


@pytest.mark.parametrize(
    ("damage", "expected"), [d[1:] for d in NESTED_DAMAGE], ids=[d[0] for d in NESTED_DAMAGE]
)
def test_check_of_a_tree_names_the_path_and_the_reason(
    tree: Path, damage: Callable[[Path], None], expected: list[Failure]
) -> None:
    sealed = receipt.seal(tree, "step-3", marker=None)
    damage(tree)
    assert receipt.check(tree, sealed) == expected
    with pytest.raises(ReceiptMismatch) as info:
        receipt.verify(tree, sealed, what="generation x")
    assert info.value.failures == expected


def good_tree_record() -> dict[str, Any]:
    return {
        "directories": ["a", "a/b", "empty"],
        "files": [
            {"path": "a/b/c.pt", "sha256": "a" * 64, "size": 3},
            {"path": "a/w.pt", "sha256": "b" * 64, "size": 0},
            {"path": "top.pt", "sha256": "c" * 64, "size": 1},
        ],
        "label": "step-3",
        "schema": receipt.SCHEMA_NESTED,
    }


def tree_entry(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(record: dict[str, Any]) -> None:
        record["files"][1].update(changes)

    return mutate


def directory(path: str) -> Callable[[dict[str, Any]], None]:
    def mutate(record: dict[str, Any]) -> None:
        record["directories"].append(path)
        record["directories"].sort()

    return mutate


def flat_schema(record: dict[str, Any]) -> None:
    del record["directories"]
    record["schema"] = receipt.SCHEMA


TOO_DEEP = "/".join(["d"] * (receipt.MAX_DEPTH + 1))
MALFORMED_TREES: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("absolute", tree_entry(path="/a/w.pt")),
    ("empty segment", tree_entry(path="a//w.pt")),
    ("trailing slash", tree_entry(path="a/w.pt/")),
    ("dot segment", tree_entry(path="a/./w.pt")),
    ("dotdot segment", tree_entry(path="a/../w.pt")),
    ("dotdot at the end", tree_entry(path="a/..")),
    ("backslash", tree_entry(path="a\\w.pt")),
    ("nul", tree_entry(path="a/w\0.pt")),
    ("drive", tree_entry(path="a:w.pt")),
    ("undecodable", tree_entry(path="a/\udcff.pt")),
    ("directory dotdot", directory("..")),
    ("directory absolute", directory("/etc")),
    ("directory drive", directory("C:")),
    ("directory not a string", lambda r: r["directories"].insert(0, 3)),
    ("directories not a list", lambda r: r.update(directories="a")),
    ("directories unsorted", lambda r: r["directories"].reverse()),
    ("directories duplicated", lambda r: r["directories"].insert(0, "a")),
    ("directories empty", lambda r: r.update(directories=[])),
    ("file under an unlisted directory", tree_entry(path="a/x/w.pt")),
    ("directory under an unlisted one", directory("x/y")),
    ("a path both file and directory", directory("top.pt")),
    (
        "a file too deep",
        lambda r: r["files"].append({"path": TOO_DEEP + "/f", "sha256": "d" * 64, "size": 0}),
    ),
    ("a directory too deep", directory(TOO_DEEP)),
    ("schema 1 with directories", lambda r: r.update(schema=receipt.SCHEMA)),
    ("schema 2 without directories", lambda r: r.pop("directories")),
    ("schema 1 with a nested path", flat_schema),
    ("unknown schema", lambda r: r.update(schema="dcp-invariant/receipt/3")),
]


def test_the_malformed_trees_start_from_a_valid_record() -> None:
    decoded = Receipt.decode(canonical.dumps(good_tree_record()))
    assert decoded.directories == ("a", "a/b", "empty")
    assert [f.path for f in decoded.files] == ["a/b/c.pt", "a/w.pt", "top.pt"]


@pytest.mark.parametrize(("name", "mutate"), MALFORMED_TREES, ids=[m[0] for m in MALFORMED_TREES])
def test_decode_rejects_paths_that_could_leave_the_root_and_broken_trees(
    name: str, mutate: Callable[[dict[str, Any]], None]
) -> None:
    record = good_tree_record()
    mutate(record)
    try:
        raw = canonical.dumps(record)
    except UnicodeEncodeError:
        # An undecodable name cannot even be written as canonical JSON; check the record as
        # a hostile writer would send it, with the escape spelled out.
        raw = json.dumps(record, sort_keys=True, separators=(",", ":")).encode() + b"\n"
    with pytest.raises(ReceiptError, match=r"^receipt: ") as info:
        Receipt.decode(raw)
    # Each row fails for its own reason, not one an earlier check happened to catch.
    assert WHY[name] in str(info.value)


WHY = {
    **dict.fromkeys(
        [m[0] for m in MALFORMED_TREES[:9]] + ["a file too deep"], "malformed file entry"
    ),
    "undecodable": "surrogates not allowed",  # canonical JSON refuses it before any path check
    **dict.fromkeys(
        [
            "directory dotdot",
            "directory absolute",
            "directory drive",
            "directory not a string",
            "a directory too deep",
        ],
        "malformed directory entry",
    ),
    "directories not a list": "files and directories lists",
    "directories unsorted": "directory entries must be unique and sorted",
    "directories duplicated": "directory entries must be unique and sorted",
    "directories empty": "a flat one is 'dcp-invariant/receipt/1'",
    "file under an unlisted directory": "'a/x/w.pt' lies in 'a/x', which is not listed",
    "directory under an unlisted one": "'x/y' lies in 'x', which is not listed",
    "a path both file and directory": "'top.pt' is listed as a file and as a directory",
    "schema 1 with directories": "has exactly the keys files, label, schema",
    "schema 2 without directories": "has exactly the keys directories, files, label, schema",
    "schema 1 with a nested path": "malformed file entry {'path': 'a/b/c.pt'",
    "unknown schema": "unknown schema 'dcp-invariant/receipt/3'",
}
