"""Real ``.metadata`` files of torch 2.13.0 read as records, and what is not DCP's shape refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from inspect_data import WORLD_SIZES, metadata_bytes, parsed, tensor, with_chunks
from metadata_pickler import Writer, dumps, memo_bomb

from dcp_invariant import regular_file
from dcp_invariant.inspection import metadata, records, unpickler
from dcp_invariant.inspection.admitted import DCP_METADATA
from dcp_invariant.inspection.budget import MIN_UNITS, UNITS_PER_BYTE, Budget
from dcp_invariant.inspection.errors import BadValues, MalformedMetadata, MetadataTooLarge

FLOAT32 = records.TensorProperties(
    records.DType("float32"), records.Layout("strided"), False, "contiguous_format", False
)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_a_real_metadata_reads_as_what_dcp_saved(world_size: int) -> None:
    meta = parsed(world_size)
    # tests/inspection/dcp_writer.py saves 42 keys: the model, Adam's state, plain tensors, extras.
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


def _shared_chunk_list(tensors: int, chunks: int) -> bytes:
    """One list of ``chunks`` chunks, memoized, then named by ``tensors`` tensors."""
    w = Writer(4)
    w.global_(DCP_METADATA, "Metadata")
    w.op(b")\x81}(")
    w.value("state_dict_metadata")
    w.op(b"}(")
    for i in range(tensors):
        w.value(f"k{i:04d}")
        w.global_(DCP_METADATA, "TensorStorageMetadata")
        w.op(b")\x81}(")
        w.value("properties")
        w.properties(FLOAT32)
        w.value("size")
        w.size((chunks,))
        w.value("chunks")
        if i == 0:
            w.op(b"](")
            for row in range(chunks):
                w.chunk(records.ChunkStorageMetadata((row,), (1,)))
            w.op(b"e\x94")  # APPENDS, MEMOIZE: the list is memo entry 0
        else:
            w.op(b"h\x00")  # BINGET 0: the same list again
        w.op(b"ub")
    w.op(b"uub")
    return b"\x80\x04" + b"".join(w.out) + b"."


def test_a_list_shared_through_the_memo_counts_at_every_reference() -> None:
    # One list of 2 000 chunks named by 2 000 tensors: 4 million chunks to check, from 0.3 MB.
    data = _shared_chunk_list(2000, 2000)
    budget = Budget()
    with pytest.raises(MetadataTooLarge, match=r"^state_dict_metadata\['k\d{4}'\]\.chunks"):
        metadata.parse(data, budget)
    # Refused when the count passed the budget, not after converting every reference.
    assert budget.limit == MIN_UNITS + UNITS_PER_BYTE * len(data)
    assert budget.spent <= budget.limit + 2000 + 3
    # Named by a few tensors, the same list is what a file of its size may hold.
    few = metadata.parse(_shared_chunk_list(3, 2000))
    assert len(tensor(few, "k0002").chunks) == 2000


def test_the_memo_bomb_is_refused_after_a_fraction_of_its_references() -> None:
    """One chunk of 100 000 dimensions named 30 000 times: 262 KB, three billion dimensions."""
    data = memo_bomb(100_000, 30_000)
    assert len(data) < 262_144
    budget = Budget()
    with pytest.raises(MetadataTooLarge) as caught:
        metadata.parse(data, budget)
    assert str(caught.value).startswith("state_dict_metadata['bomb'].chunks[")
    assert "expand to more than the" in str(caught.value)
    # The work done is the budget's, about three dimensions per byte, not 3 * 10**9.
    assert budget.spent <= budget.limit + 100_000


@pytest.mark.parametrize(
    "pickle_ops",
    [
        # One 10 000-long tuple, then torch.Size of it 100 000 times.
        b"("
        + b"K\x01" * 10_000
        + b"t\x94"
        + b"\x8c\x05torch\x8c\x04Size\x93\x94"
        + b"h\x01h\x00\x85R0" * 100_000,
        # The same tuple as a dict key 100 000 times.
        b"(" + b"K\x01" * 10_000 + b"t\x94}(" + b"h\x00N" * 100_000 + b"u",
    ],
    ids=["torch.Size of one tuple", "one tuple as a key"],
)
def test_a_long_tuple_named_again_and_again_is_counted_each_time(pickle_ops: bytes) -> None:
    data = b"\x80\x04" + pickle_ops + b"N."
    budget = Budget()
    with pytest.raises(MetadataTooLarge, match="near byte"):
        unpickler.load(data, budget)
    assert budget.spent <= budget.limit + 10_000


def test_one_state_built_into_many_records_is_counted_for_each() -> None:
    # A dict of 10 000 fields, then 100 000 chunks built with it: each one reads every field.
    w = Writer(4)
    w.global_(DCP_METADATA, "Metadata")
    w.op(b")\x81}(")
    w.value("state_dict_metadata")
    w.op(b"}(")
    w.value("w")
    w.global_(DCP_METADATA, "TensorStorageMetadata")
    w.op(b")\x81}(")
    w.value("properties")
    w.properties(FLOAT32)
    w.value("size")
    w.size((1,))
    w.value("chunks")
    w.op(b"](")
    w.global_(DCP_METADATA, "ChunkStorageMetadata")
    w.op(b"\x94)\x81")  # the class: memo entry 0
    w.dict_({"offsets": (0,), "sizes": (1,), **{f"f{i}": i for i in range(10_000)}})
    w.op(b"\x94b")  # the state: memo entry 1
    w.op(b"h\x00)\x81h\x01b" * 100_000)
    w.op(b"eubuub")
    budget = Budget()
    with pytest.raises(MetadataTooLarge, match=r"chunks\[\d+\]"):
        metadata.parse(b"\x80\x04" + b"".join(w.out) + b".", budget)
    assert budget.spent <= budget.limit + 10_003


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_a_real_metadata_spends_a_small_part_of_its_budget(world_size: int) -> None:
    """What DCP writes costs less than a tenth of UNITS_PER_BYTE: the budget's headroom."""
    data = metadata_bytes(world_size)
    budget = Budget()
    metadata.parse(data, budget)
    assert 0 < budget.spent < UNITS_PER_BYTE / 10 * len(data)


def test_a_large_genuine_metadata_passes_the_budget() -> None:
    """10 000 chunks of 2-D tensors as FSDP2 saves them at world size 100: within budget."""
    meta = parsed(1)
    state = dict(meta.state_dict_metadata)
    storage = dict(meta.storage_data or {})
    for t in range(100):
        key = f"layer.{t}.weight"
        chunks = tuple(records.ChunkStorageMetadata((r * 4, 0), (4, 64)) for r in range(100))
        state[key] = records.TensorStorageMetadata(FLOAT32, (400, 64), chunks)
        for i, chunk in enumerate(chunks):
            index = records.MetadataIndex(key, chunk.offsets, i)
            storage[index] = records.StorageInfo(f"__{i}_0.distcp", t * 1024, 1024)
    data = dumps(dataclasses.replace(meta, state_dict_metadata=state, storage_data=storage))
    budget = Budget()
    big = metadata.parse(data, budget)
    assert len(tensor(big, "layer.99.weight").chunks) == 100
    assert budget.spent < UNITS_PER_BYTE / 10 * len(data)


# --- numbers where they enter ---------------------------------------------------------------

_HUGE = (2**63, 2**64, 2**2000, 2**20000, -1, -(2**2000))
_HUGE_IDS = ("2**63", "2**64", "2**2000", "2**20000", "-1", "-2**2000")


def _with_info(field: str, value: int) -> bytes:
    def change(meta: records.Metadata) -> records.Metadata:
        assert meta.storage_data is not None
        index = records.MetadataIndex("extra.step")
        storage = dict(meta.storage_data)
        info = storage[index]
        if field == "length":
            storage[index] = dataclasses.replace(info, length=value)
        else:
            storage[index] = dataclasses.replace(info, offset=value)
        return dataclasses.replace(meta, storage_data=storage)

    return dumps(change(parsed(1)))


def _shown(value: int) -> str:
    if value.bit_length() <= 64:
        return str(value)
    return f"{'-' if value < 0 else ''}an integer of {value.bit_length()} bits"


@pytest.mark.parametrize("value", _HUGE, ids=_HUGE_IDS)
@pytest.mark.parametrize("field", ["length", "offset"])
def test_a_storage_entry_out_of_int64_is_a_bad_value(field: str, value: int) -> None:
    with pytest.raises(BadValues) as caught:
        metadata.parse(_with_info(field, value))
    assert caught.value.reasons() == (
        f"storage_data['extra.step'].{field} is {_shown(value)}: torch and DCP hold it as an "
        "int64 from 0 to 2**63 - 1",
    )


@pytest.mark.parametrize("value", _HUGE, ids=_HUGE_IDS)
@pytest.mark.parametrize("field", ["offsets", "sizes"])
def test_a_chunk_out_of_int64_is_a_bad_value(field: str, value: int) -> None:
    def change(meta: records.Metadata) -> records.Metadata:
        (chunk,) = tensor(meta, "plain.f32").chunks
        moved = dataclasses.replace(chunk, **{field: (0, value)})
        return with_chunks(meta, "plain.f32", (moved,))

    with pytest.raises(BadValues) as caught:
        metadata.parse(dumps(change(parsed(1))))
    assert caught.value.reasons() == (
        f"state_dict_metadata['plain.f32'].chunks[0].{field}[1] is {_shown(value)}: torch and "
        "DCP hold it as an int64 from 0 to 2**63 - 1",
    )


def _with_size(key: str, size: records.Shape) -> bytes:
    def change(meta: records.Metadata) -> records.Metadata:
        state = dict(meta.state_dict_metadata)
        state[key] = dataclasses.replace(tensor(meta, key), size=size)
        return dataclasses.replace(meta, state_dict_metadata=state)

    return dumps(change(parsed(1)))


@pytest.mark.parametrize("value", _HUGE, ids=_HUGE_IDS)
def test_a_global_shape_out_of_int64_is_a_bad_value(value: int) -> None:
    with pytest.raises(BadValues) as caught:
        metadata.parse(_with_size("plain.f32", (3, value)))
    assert caught.value.reasons() == (
        f"state_dict_metadata['plain.f32'].size[1] is {_shown(value)}: torch and DCP hold it "
        "as an int64 from 0 to 2**63 - 1",
    )


def test_a_shape_past_int64_by_one_is_a_bad_value_not_sound() -> None:
    with pytest.raises(BadValues) as caught:
        metadata.parse(_with_size("plain.f32", (2**63 + 1, 4)))
    assert caught.value.reasons() == (
        "state_dict_metadata['plain.f32'].size[0] is 9223372036854775809: torch and DCP hold "
        "it as an int64 from 0 to 2**63 - 1",
    )


@pytest.mark.parametrize(
    ("size", "says"),
    [
        # Dimensions within int64 whose product is past it.
        ((2**62, 2), "holds 9223372036854775808 elements of 4 bytes"),
        # Within int64 as elements, past it as float32 bytes (torch refuses it too).
        ((2**60, 4), "holds 4611686018427387904 elements of 4 bytes"),
        # An element count of more than 4 300 digits: never converted to text.
        ((2**62,) * 300, "holds more than 2**64 elements of 4 bytes"),
        # Past 2**64, then 0: aten counts the overflow all the same.
        ((2**40, 2**40, 0), "holds more than 2**64 elements of 4 bytes"),
    ],
)
def test_an_element_or_byte_count_past_int64_is_a_bad_value(size: records.Shape, says: str) -> None:
    with pytest.raises(BadValues) as caught:
        metadata.parse(_with_size("plain.f32", size))
    (reason,) = caught.value.reasons()
    assert reason.startswith("state_dict_metadata['plain.f32'].size (")
    assert f": a float32 tensor of this shape {says}, past int64" in reason
    assert len(reason) < 500  # a shape of many dimensions is shown by its first few
    assert len(size) < 8 or f", ... {len(size)} dims):" in reason


@pytest.mark.parametrize(
    "size", [(2**62, 2, 0), (0, 2**63 - 1), (2**63 - 1,)], ids=["zero-after", "zero", "max"]
)
def test_a_count_aten_allows_is_no_bad_value(size: records.Shape) -> None:
    # uint8: 2**63 - 1 elements of 1 byte; a 0 before any overflow makes every product 0.
    def change(meta: records.Metadata) -> records.Metadata:
        state = dict(meta.state_dict_metadata)
        state["plain.u8"] = dataclasses.replace(tensor(meta, "plain.u8"), size=size)
        return dataclasses.replace(meta, state_dict_metadata=state)

    assert tensor(metadata.parse(dumps(change(parsed(1)))), "plain.u8").size == size


def test_many_bad_values_are_named_then_counted() -> None:
    def change(meta: records.Metadata) -> records.Metadata:
        assert meta.storage_data is not None
        storage = {i: dataclasses.replace(s, length=-1) for i, s in meta.storage_data.items()}
        return dataclasses.replace(meta, storage_data=storage)

    with pytest.raises(BadValues) as caught:
        metadata.parse(dumps(change(parsed(1))))
    reasons = caught.value.reasons()
    assert len(reasons) == metadata.MAX_LISTED_VALUES
    assert all(".length is -1: torch and DCP hold it" in r for r in reasons)
    assert reasons[-1].endswith(f"(and {42 - metadata.MAX_LISTED_VALUES} more bad values)")


def test_a_length_that_is_not_an_integer_is_a_bad_value() -> None:
    data = _with_info("length", 7)
    changed = data.replace(b"\x8c\x06lengthK\x07", b"\x8c\x06length\x88")  # True, not 7
    assert changed != data
    with pytest.raises(BadValues) as caught:
        metadata.parse(changed)
    assert caught.value.reasons() == (
        "storage_data['extra.step'].length is a bool, not an integer: torch and DCP hold it as "
        "an int64 from 0 to 2**63 - 1",
    )


# --- any records read back as they were written -------------------------------------------

# Up to 2**60 elements: a tensor of any of the dtypes below fits int64 bytes.
_SHAPES = st.lists(st.integers(0, 2**20), max_size=3).map(tuple)


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
            draw(st.integers(0, metadata.INT64_MAX)),
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


def test_a_storage_key_offset_and_strides_out_of_int64_are_bad_values() -> None:
    def change(meta: records.Metadata) -> records.Metadata:
        assert meta.storage_data is not None
        storage = dict(meta.storage_data)
        (chunk,) = tensor(meta, "plain.f32").chunks
        info = storage.pop(records.MetadataIndex("plain.f32", chunk.offsets))
        storage[records.MetadataIndex("plain.f32", (0, 2**2000))] = info
        state = dict(meta.state_dict_metadata)
        item = tensor(meta, "plain.f64")
        strided = dataclasses.replace(item.properties, strides=(2**63,))
        state["plain.f64"] = dataclasses.replace(item, properties=strided)
        return dataclasses.replace(meta, state_dict_metadata=state, storage_data=storage)

    with pytest.raises(BadValues) as caught:
        metadata.parse(dumps(change(parsed(1))))
    assert set(caught.value.reasons()) == {
        "state_dict_metadata['plain.f64'].properties.strides[0] is 9223372036854775808: torch "
        "and DCP hold it as an int64 from 0 to 2**63 - 1",
        "storage_data['plain.f32'] key offset[1] is an integer of 2001 bits: torch and DCP hold "
        "it as an int64 from 0 to 2**63 - 1",
    }


def test_a_storage_key_offset_of_a_list_is_a_bad_value_not_a_crash() -> None:
    """An offset pickled as a plain tuple (no torch.Size) holding a list: a bad value, and never
    hashed as a key (a list cannot be)."""
    data = dumps(parsed(2))
    size = b"\x8c\x06offset\x8c\x05torch\x8c\x04Size\x93K\x00K\x00\x86\x85R"
    assert size in data
    with pytest.raises(BadValues) as caught:
        metadata.parse(data.replace(size, b"\x8c\x06offset]K\x00\x86", 1))
    assert caught.value.reasons() == (
        "storage_data['model.0.weight'] key offset[0] is a list, not an integer: torch and DCP "
        "hold it as an int64 from 0 to 2**63 - 1",
    )
