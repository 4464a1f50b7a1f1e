"""``inspect_checkpoint`` on checkpoints built from real metadata: each damage caught and named."""

from __future__ import annotations

import dataclasses
import os
import random
import tempfile
from pathlib import Path
from typing import get_args

import pytest
from dcp_writer import TEST_DATA
from hypothesis import given, settings
from hypothesis import strategies as st
from inspect_data import (
    WORLD_SIZES,
    edited,
    make_checkpoint,
    metadata_bytes,
    parsed,
    shard_sizes,
    tensor,
    with_chunks,
)
from metadata_pickler import memo_bomb

from dcp_invariant import canonical
from dcp_invariant.errors import NotACheckpoint
from dcp_invariant.inspection import inspect_checkpoint, metadata, records
from dcp_invariant.inspection.problems import Cause


def said(directory: Path) -> list[str]:
    return [str(p) for p in inspect_checkpoint(directory).problems]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_a_complete_checkpoint_is_sound(tmp_path: Path, world_size: int) -> None:
    report = inspect_checkpoint(make_checkpoint(tmp_path / "ckpt", world_size))
    assert report.problems == ()
    assert report.contents is not None
    assert (report.contents.keys, report.contents.tensors, report.contents.byte_items) == (
        42,
        26,
        16,
    )
    assert len(report.contents.files) == world_size
    assert report.receipt is None


def test_a_removed_shard_is_named_with_what_it_held(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", 2)
    (directory / "__1_0.distcp").unlink()
    (problem,) = said(directory)
    assert problem.startswith("missing file: __1_0.distcp (named by ")


def test_a_truncated_shard_is_named_with_the_item_past_its_end(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", 2)
    size = shard_sizes(parsed(2))["__0_0.distcp"]
    os.truncate(directory / "__0_0.distcp", size - 1)
    (problem,) = said(directory)
    assert problem.startswith(f"truncated: __0_0.distcp holds {size - 1} bytes; 1 item lies")
    assert problem.endswith(f"..{size}")


def test_a_symlinked_shard_is_refused_not_followed(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", 2)
    outside = tmp_path / "elsewhere.distcp"
    (directory / "__0_0.distcp").rename(outside)
    try:
        (directory / "__0_0.distcp").symlink_to(outside)
    except OSError as exc:
        pytest.skip(f"cannot create symlinks here: {exc}")
    (problem,) = said(directory)
    assert problem.startswith("not a regular file: __0_0.distcp is a symlink (named by ")


def test_a_directory_where_a_shard_belongs_is_refused(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", 1)
    (directory / "__0_0.distcp").unlink()
    (directory / "__0_0.distcp").mkdir()
    assert said(directory)[0].startswith("not a regular file: __0_0.distcp is a directory")


@pytest.mark.parametrize("name", ["../outside.distcp", "/etc/passwd", "sub/x.distcp", ".."])
def test_a_path_leaving_the_directory_is_refused(tmp_path: Path, name: str) -> None:
    def move(meta: records.Metadata) -> records.Metadata:
        assert meta.storage_data is not None
        storage = {
            index: dataclasses.replace(info, relative_path=name)
            for index, info in meta.storage_data.items()
        }
        return dataclasses.replace(meta, storage_data=storage)

    (tmp_path / "outside.distcp").write_bytes(b"\0" * 100_000)
    directory = make_checkpoint(tmp_path / "ckpt", 1, edited(1, move))
    (problem,) = said(directory)
    assert problem.startswith(
        f"unsafe path: {name!r} is not a plain file name inside the directory"
    )


def test_a_chunk_overlap_is_named(tmp_path: Path) -> None:
    def overlap(meta: records.Metadata) -> records.Metadata:
        first, _ = tensor(meta, "model.0.weight").chunks  # rows 0-4 and 5-9
        moved = records.ChunkStorageMetadata((4, 0), (6, 8))
        return with_chunks(meta, "model.0.weight", (first, moved))

    directory = make_checkpoint(tmp_path / "ckpt", 2, edited(2, overlap))
    assert said(directory) == [
        "missing item: model.0.weight: 1 chunk with no storage entry (at offsets (4, 0))",
        "overlap: model.0.weight: element (4, 0) is in 2 chunks (at offsets (0, 0) and (4, 0))",
    ]


def test_a_gap_is_named(tmp_path: Path) -> None:
    def gap(meta: records.Metadata) -> records.Metadata:
        first, _ = tensor(meta, "model.0.weight").chunks
        shorter = records.ChunkStorageMetadata((5, 0), (4, 8))  # row 9 is in no chunk
        return with_chunks(meta, "model.0.weight", (first, shorter))

    directory = make_checkpoint(tmp_path / "ckpt", 2, edited(2, gap))
    assert said(directory) == [
        "gap: model.0.weight: element (9, 0) is in no chunk (the chunks hold 72 elements of 80, "
        "counting overlaps)"
    ]


def test_a_byte_item_without_its_entry_is_named(tmp_path: Path) -> None:
    def drop(meta: records.Metadata) -> records.Metadata:
        assert meta.storage_data is not None
        storage = {i: s for i, s in meta.storage_data.items() if i.fqn != "extra.name"}
        return dataclasses.replace(meta, storage_data=storage)

    directory = make_checkpoint(tmp_path / "ckpt", 2, edited(2, drop))
    assert said(directory) == ["missing item: extra.name: a byte item with no storage entry"]


def test_metadata_of_another_storage_writer_is_named(tmp_path: Path) -> None:
    directory = make_checkpoint(
        tmp_path / "ckpt", 1, edited(1, lambda m: dataclasses.replace(m, storage_data=None))
    )
    assert said(directory) == [
        "unknown storage: storage_data is none, not FileSystemWriter's map of items to files; "
        "inspect checks checkpoints written by dcp.save to a directory"
    ]


def test_a_hostile_metadata_is_refused_and_nothing_else_is_read(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    hostile = b"cos\nsystem\n(S'touch " + str(ran).encode() + b"'\ntR."
    directory = make_checkpoint(tmp_path / "ckpt", 1, hostile)
    report = inspect_checkpoint(directory)
    assert [str(p) for p in report.problems] == ["refused pickle: global os.system"]
    assert report.contents is None
    assert not ran.exists()


def test_a_truncated_metadata_is_malformed(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", 1, metadata_bytes(1)[:-100])
    (problem,) = said(directory)
    assert problem.startswith("malformed metadata: ") and "truncated" in problem


def test_a_symlinked_metadata_is_refused(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", 1)
    (directory / ".metadata").rename(tmp_path / "real.metadata")
    try:
        (directory / ".metadata").symlink_to(tmp_path / "real.metadata")
    except OSError as exc:
        pytest.skip(f"cannot create symlinks here: {exc}")
    assert said(directory) == ["not a regular file: .metadata is a symlink"]


def test_a_directory_without_metadata_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "__0_0.distcp").write_bytes(b"x")
    with pytest.raises(NotACheckpoint, match=r"has no \.metadata: pass the directory dcp\.save"):
        inspect_checkpoint(tmp_path)
    with pytest.raises(NotACheckpoint, match="does not exist"):
        inspect_checkpoint(tmp_path / "absent")
    with pytest.raises(NotACheckpoint, match="is not a directory"):
        inspect_checkpoint(tmp_path / "__0_0.distcp")


@settings(max_examples=150, deadline=None, database=None)
@given(st.data())
def test_any_damage_to_the_metadata_bytes_is_reported_never_raised(data: st.DataObject) -> None:
    raw = bytearray(metadata_bytes(2))
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    with tempfile.TemporaryDirectory() as work:
        report = inspect_checkpoint(make_checkpoint(Path(work) / "ckpt", 2, bytes(raw)))
    assert report.sound == (report.problems == ())
    assert all(str(p).split(":")[0] in get_args(Cause) for p in report.problems)


def test_a_checkpoint_torch_2_15_wrote_is_sound_and_its_strides_are_read(tmp_path: Path) -> None:
    """torch 2.15 adds the strides to TensorProperties' pickled state: not a problem."""
    raw = (TEST_DATA / "torch-2.15.0-ws2.metadata").read_bytes()
    meta = metadata.parse(raw)
    tensors = [
        v for v in meta.state_dict_metadata.values() if isinstance(v, records.TensorStorageMetadata)
    ]
    assert tensors and all(t.properties.strides is not None for t in tensors)
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    (directory / ".metadata").write_bytes(raw)
    for name, size in shard_sizes(meta).items():
        with open(directory / name, "wb") as f:
            f.truncate(size)
    report = inspect_checkpoint(directory, world_size=4)
    assert report.problems == (), report.problems


MUTANTS = 1000
SEED = 20260


def test_a_thousand_seeded_byte_mutants_are_reported_never_raised(tmp_path: Path) -> None:
    """1 to 4 bytes of a real .metadata changed at random (seeded), a thousand times: every
    outcome is a report, in each output mode, and nothing the pickle names ever runs."""
    rng = random.Random(SEED)
    original = metadata_bytes(2)
    directory = make_checkpoint(tmp_path / "ckpt", 2)
    causes = set()
    for _ in range(MUTANTS):
        raw = bytearray(original)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        (directory / ".metadata").write_bytes(bytes(raw))
        report = inspect_checkpoint(directory, world_size=3)
        report.lines()
        canonical.dumps(report.to_record())
        assert report.sound == (report.problems == ())
        causes |= {p.cause for p in report.problems}
    assert causes <= set(get_args(Cause))
    assert {"malformed metadata", "refused pickle"} <= causes  # the mutants did reach the checks
    assert not (tmp_path / "ran").exists()


def test_the_memo_bomb_is_a_too_large_problem(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", 1, memo_bomb(100_000, 30_000))
    report = inspect_checkpoint(directory, world_size=2)
    (problem,) = report.problems
    assert str(problem).startswith("too large: state_dict_metadata['bomb'].chunks[")
    assert report.contents is None and report.estimate is None


def test_corners_of_many_tensors_share_the_budget(tmp_path: Path) -> None:
    """Each tensor's corners are bounded; many tensors of many corners pass the file's budget."""

    def cornered(meta: records.Metadata) -> records.Metadata:
        state = dict(meta.state_dict_metadata)
        storage = dict(meta.storage_data or {})
        shape = (2,) * 12
        half = records.ChunkStorageMetadata((0,) * 12, (1,) * 12)  # 2**12 corners, a gap
        for t in range(40):
            key = f"t{t}"
            state[key] = records.TensorStorageMetadata(
                tensor(meta, "plain.u8").properties, shape, (half,)
            )
            storage[records.MetadataIndex(key, half.offsets)] = records.StorageInfo(
                "__0_0.distcp", 0, 1
            )
        return dataclasses.replace(meta, state_dict_metadata=state, storage_data=storage)

    directory = make_checkpoint(tmp_path / "ckpt", 1, edited(1, cornered))
    (problem,) = said(directory)
    assert problem.startswith("too large: t")
    assert ": the corners of its chunks: the records of .metadata expand to more than" in problem
