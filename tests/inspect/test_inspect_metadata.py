"""Real ``.metadata`` files of torch 2.13.0 read as records, and what is not DCP's shape refused."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from inspect_data import WORLD_SIZES, metadata_bytes, parsed, tensor
from metadata_pickler import Writer, dumps

from dcp_invariant import regular_file
from dcp_invariant.inspect import metadata, records
from dcp_invariant.inspect.admitted import DCP_METADATA
from dcp_invariant.inspect.errors import MalformedMetadata, MetadataTooLarge

FLOAT32 = records.TensorProperties(
    records.DType("float32"), records.Layout("strided"), False, "contiguous_format", False
)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_a_real_metadata_reads_as_what_dcp_saved(world_size: int) -> None:
    meta = parsed(world_size)
    # tests/inspect/dcp_writer.py saves 42 keys: the model, Adam's state, plain tensors, extras.
    assert len(meta.state_dict_metadata) == 42
    assert meta.version == "1.0.0"
    assert meta.storage_kind == "FileSystemWriter"
    assert meta.storage_meta is not None
    assert meta.storage_meta.checkpoint_id == records.PathValue("PosixPath", ("checkpoint",))
    weight = tensor(meta, "model.0.weight")  # Linear(8, 10) under fully_shard: (10, 8), dim 0
    assert weight.size == (10, 8)
    assert weight.properties == FLOAT32
    rows = -(-10 // world_size)
    assert [c.offsets for c in weight.chunks] == [(r, 0) for r in range(0, 10, rows)]
    assert isinstance(meta.state_dict_metadata["extra.step"], records.BytesStorageMetadata)
    assert tensor(meta, "plain.bf16").properties.dtype == records.DType("bfloat16")
    assert tensor(meta, "plain.scalar").chunks == (records.ChunkStorageMetadata((), ()),)
    assert meta.storage_data is not None
    shards = {info.relative_path for info in meta.storage_data.values()}
    assert shards == {f"__{rank}_0.distcp" for rank in range(world_size)}
    step = records.MetadataIndex("extra.step")
    assert step in meta.storage_data and meta.storage_data[step].length > 0


def test_every_dtype_the_state_holds_is_read() -> None:
    meta = parsed(1)
    dtypes = {
        item.properties.dtype.name
        for item in meta.state_dict_metadata.values()
        if isinstance(item, records.TensorStorageMetadata)
    }
    assert dtypes == {
        "float32",
        "float64",
        "bfloat16",
        "float16",
        "int64",
        "int32",
        "uint8",
        "bool",
    }


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_records_pickled_back_read_the_same(world_size: int, protocol: int) -> None:
    meta = parsed(world_size)
    assert metadata.parse(dumps(meta, protocol)) == meta


def test_a_field_without_a_class_default_is_required() -> None:
    data = metadata_bytes(1).replace(b"state_dict_metadata", b"state_dict_metadatX", 1)
    with pytest.raises(MalformedMetadata, match="Metadata: no state_dict_metadata"):
        metadata.parse(data)


def test_a_chunk_whose_sizes_are_not_a_torch_size_is_refused() -> None:
    meta = parsed(1)
    data = dumps(meta).replace(b"\x8c\x05sizes", b"\x8c\x05sizeX", 1)
    with pytest.raises(MalformedMetadata, match=r"chunks\[0\]: no sizes"):
        metadata.parse(data)


def test_a_pickle_of_something_else_is_refused() -> None:
    with pytest.raises(MalformedMetadata, match="the pickle: a list, not a Metadata"):
        metadata.parse(b"\x80\x04]\x94.")


def test_an_oversized_metadata_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / ".metadata"
    path.write_bytes(metadata_bytes(1))
    with pytest.raises(MetadataTooLarge, match="over the 1024-byte bound; it was not read"):
        metadata.read(path, bound=1024)
    assert metadata.read(path) == parsed(1)


def test_a_symlinked_metadata_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(metadata_bytes(1))
    try:
        (tmp_path / ".metadata").symlink_to(tmp_path / "real")
    except OSError as exc:
        pytest.skip(f"cannot create symlinks here: {exc}")
    with pytest.raises(regular_file.NotRegularFile):
        metadata.read(tmp_path / ".metadata")


def test_a_list_shared_through_the_memo_is_converted_once() -> None:
    # One list of 20 000 chunks, memoized, then named by 2 000 tensors: converting it once per
    # reference would take 40 million steps.
    w = Writer(4)
    w.global_(DCP_METADATA, "Metadata")
    w.op(b")\x81}(")
    w.value("state_dict_metadata")
    w.op(b"}(")
    for i in range(2000):
        w.value(f"k{i:04d}")
        w.global_(DCP_METADATA, "TensorStorageMetadata")
        w.op(b")\x81}(")
        w.value("properties")
        w.properties(FLOAT32)
        w.value("size")
        w.size((20_000,))
        w.value("chunks")
        if i == 0:
            w.op(b"](")
            for row in range(20_000):
                w.chunk(records.ChunkStorageMetadata((row,), (1,)))
            w.op(b"e\x94")  # APPENDS, MEMOIZE: the list is memo entry 0
        else:
            w.op(b"h\x00")  # BINGET 0: the same list again
        w.op(b"ub")
    w.op(b"uub")
    started = time.perf_counter()
    meta = metadata.parse(b"\x80\x04" + b"".join(w.out) + b".")
    assert time.perf_counter() - started < 20
    assert len(meta.state_dict_metadata) == 2000
    first, last = tensor(meta, "k0000").chunks, tensor(meta, "k1999").chunks
    assert first is last and len(first) == 20_000


# --- any records read back as they were written -------------------------------------------

_SHAPES = st.lists(st.integers(0, 2**40), max_size=3).map(tuple)


@st.composite
def _metadata(draw: st.DrawFn) -> records.Metadata:
    names = draw(st.lists(st.text(min_size=1, max_size=12), max_size=5, unique=True))
    state: dict[str, records.StorageMetadata] = {}
    storage: dict[records.MetadataIndex, records.StorageInfo] = {}
    for name in names:
        if draw(st.booleans()):
            state[name] = records.BytesStorageMetadata()
            offsets: records.Shape | None = None
        else:
            shape = draw(_SHAPES)
            chunks = tuple(
                records.ChunkStorageMetadata(draw(_SHAPES), draw(_SHAPES))
                for _ in range(draw(st.integers(0, 3)))
            )
            dtype = draw(st.sampled_from(["float32", "bfloat16", "int8", "float8_e4m3fn"]))
            props = records.TensorProperties(
                records.DType(dtype),
                records.Layout(draw(st.sampled_from(["strided", "sparse_coo"]))),
                draw(st.booleans()),
                draw(st.sampled_from(records.MEMORY_FORMATS)),
                draw(st.booleans()),
                draw(st.none() | _SHAPES),  # torch 2.15 pickles the strides too
            )
            state[name] = records.TensorStorageMetadata(props, shape, chunks)
            offsets = chunks[0].offsets if chunks else None
        info = records.StorageInfo(
            draw(st.text(max_size=12)),
            draw(st.integers(-(2**70), 2**70)),
            draw(st.integers(0, 2**40)),
            draw(st.none() | st.lists(st.text(max_size=5), max_size=2).map(tuple)),
        )
        storage[records.MetadataIndex(name, offsets, draw(st.none() | st.integers(0, 9)))] = info
    meta = records.StorageMeta(
        draw(st.none() | st.text(max_size=8)),
        draw(st.none() | st.text(max_size=8)),
        None,
        tuple(draw(st.lists(st.text(max_size=5), max_size=2))),
    )
    return records.Metadata(state, storage, "FileSystemWriter", meta, draw(st.none() | st.text()))


@settings(max_examples=80, deadline=None, database=None)
@given(_metadata(), st.sampled_from([2, 3, 4, 5]))
def test_any_records_read_back_as_written(meta: records.Metadata, protocol: int) -> None:
    assert metadata.parse(dumps(meta, protocol)) == meta
