"""``.metadata`` as typed records: read with a bound, interpreted without pickle, then checked
field by field against the shape of torch's classes.

The interpreter (:mod:`.unpickler`) gives the stand-ins torch's unpickling would have built;
this turns them into :mod:`.records`, with the semantics torch gives them on loading: BUILD of
a dataclass updates its ``__dict__`` (a field left out keeps its class default, if it has one),
``TensorProperties.__setstate__`` unpacks a 5-tuple (6 since torch 2.15: the strides), and a
dict keeps the last value of a key seen twice (``MetadataIndex`` compares ``fqn`` and ``offset``
only).

Numbers are checked here, where they enter: every length, offset, size and shape is an int
torch and DCP can hold (0 to 2**63 - 1: ``torch.Size`` and ``_StorageInfo`` are read as int64),
and each tensor's element count, and its byte count, fit int64 too (aten's
``computeStorageNbytesContiguous`` refuses to make a tensor otherwise). Anything else is a
``bad value`` naming the key. Every chunk, dimension and entry is counted against the file's
work budget (:mod:`.budget`) each time a memo reference names it, before it is converted.

The chunks and entries the interpreter's templates read come with their records made (the
same checks, done there once): a run of them is taken whole, its work counted at once, and
``storage_data`` is kept as rows (:class:`records.StorageData`).
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import operator
from collections.abc import Iterator
from pathlib import Path
from typing import Final, TypeVar, cast

from dcp_invariant import regular_file
from dcp_invariant.dcp_layout import METADATA_FILE
from dcp_invariant.inspection import admitted, records, tiling, unpickler
from dcp_invariant.inspection.budget import Budget
from dcp_invariant.inspection.errors import BadValues, MalformedMetadata, MetadataTooLarge
from dcp_invariant.inspection.unpickler import Instance, PickledDict

# A .metadata is read whole; larger than this, it is refused unread. DCP's grows by a few hundred
# bytes per chunk: 512 MiB is millions of chunks.
MAX_METADATA_BYTES: Final = 512 << 20
INT64_MAX: Final = records.INT64_MAX
_U64_MAX: Final = (1 << 64) - 1
# Bad values named one by one; the rest are counted.
MAX_LISTED_VALUES: Final = 8

_T = TypeVar("_T")
_MISSING: Final = object()


def read(
    path: Path, *, bound: int = MAX_METADATA_BYTES, budget: Budget | None = None
) -> records.Metadata:
    """Read and interpret the ``.metadata`` at ``path``.

    Raises a :class:`MetadataProblem` (a refused, malformed or oversized pickle, bad values, or
    records past the work budget) and the ``OSError``\\ s of :func:`regular_file.read`
    (including :class:`regular_file.NotRegularFile`).
    """
    try:
        data = regular_file.read(path, bound=bound)
    except regular_file.OverBound as exc:
        shown = f"{bound >> 20} MiB" if bound % (1 << 20) == 0 else f"{bound}-byte"
        raise MetadataTooLarge(
            f"{METADATA_FILE} is over the {shown} bound; it was not read"
        ) from exc
    return parse(data, budget)


def parse(data: bytes, budget: Budget | None = None) -> records.Metadata:
    """Interpret the bytes of a ``.metadata``: :class:`MetadataProblem` if they are not one.

    ``budget`` (by default one for a file of this size) is what is spent; the checks that
    follow spend the rest of it.
    """
    if budget is None:
        budget = Budget()
    budget.for_bytes(len(data))
    converter = _Converter(budget)
    with collector_paused():
        meta = converter.metadata(unpickler.load(data, budget))
    if converter.bad:
        found = converter.bad
        if converter.unlisted:
            found[-1] += f" (and {converter.unlisted} more bad values)"
        raise BadValues(tuple(found))
    return meta


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off, while millions of objects are made and kept.

    Each of its full passes visits every live object, and it makes one each time the objects
    grow by a quarter: on a million chunks that was more time than the reading itself. Nothing
    is lost: what is read here is all kept until it is returned, and a cycle a file makes and
    drops (a list that holds itself, popped) is at most a few objects for each of its bytes,
    collected once the pass is back on.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _Converter:
    def __init__(self, budget: Budget) -> None:
        self.budget = budget
        self.bad: list[str] = []  # what a bad value problem says, the first few
        self.unlisted = 0  # bad values past those

    def spend(self, units: int, what: str) -> None:
        self.budget.spend(units, what)

    def found_bad(self, detail: str) -> None:
        if len(self.bad) < MAX_LISTED_VALUES:
            self.bad.append(detail)
        else:
            self.unlisted += 1

    # --- the records -----------------------------------------------------------------------

    def metadata(self, value: object) -> records.Metadata:
        fields = self.fields(value, "Metadata", "the pickle")
        entries = _require(fields, "state_dict_metadata", "Metadata")
        state_dict = {
            key: self.storage(item, f"state_dict_metadata[{key!r}]")
            for key, item in self.str_pairs(entries, "state_dict_metadata")
        }
        storage = fields.get("storage_data")
        storage_data = None
        if isinstance(storage, PickledDict):
            storage_data = self.storage_data(storage)
            kind = "FileSystemWriter"
        else:
            kind = "none" if storage is None else _kind(storage)
        version = fields.get("version")
        meta = fields.get("storage_meta")
        return records.Metadata(
            state_dict_metadata=state_dict,
            storage_data=storage_data,
            storage_kind=kind,
            storage_meta=None if meta is None else self.storage_meta(meta),
            version=_optional(version, str, "Metadata.version"),
        )

    def storage(self, value: object, where: str) -> records.StorageMetadata:
        if isinstance(value, Instance) and value.cls.record == "BytesStorageMetadata":
            self.fields(value, "BytesStorageMetadata", where)
            return records.BytesStorageMetadata()
        return self.tensor(value, where)

    def tensor(self, value: object, where: str) -> records.TensorStorageMetadata:
        fields = self.fields(value, "TensorStorageMetadata", where)
        chunks = _require(fields, "chunks", where)
        if not isinstance(chunks, list):
            raise MalformedMetadata(f"{where}.chunks: a {_kind(chunks)}, not a list")
        self.spend(len(chunks), f"{where}.chunks")
        properties = self.properties(_require(fields, "properties", where), f"{where}.properties")
        size = self.shape(_require(fields, "size", where), where, ".size")
        self.fits(size, properties.dtype, where)
        made: list[records.ChunkStorageMetadata] = []
        read = _records(chunks)
        for start, stop, by_template in _runs(read, len(chunks)):
            if by_template and read and self.take_read(made, _chunks_read(read[start:stop])):
                continue
            for i in range(start, stop):
                made.append(self.chunk(chunks[i], where, i))
        return records.TensorStorageMetadata(properties=properties, size=size, chunks=tuple(made))

    def take_read(self, made: list[_T], found: tuple[list[_T], int] | None) -> bool:
        """Add the records of a run a template read (:func:`_chunks_read`,
        :func:`_entries_read`) to ``made``, spending their work, unless that passes the budget:
        then each is read on its own, and what passes it says where."""
        if found is None:
            return False
        records_found, work = found
        budget = self.budget
        if budget.limit >= 0 and budget.spent + work > budget.limit:
            return False
        budget.spent += work
        made += records_found
        return True

    def chunk(self, value: object, where: str, i: int) -> records.ChunkStorageMetadata:
        if type(value) is Instance and value.cls.record == "ChunkStorageMetadata":
            state = value.state
            # What DCP writes: a dict of offsets and sizes, read without building a dict.
            if type(state) is PickledDict and len(pairs := state.pairs) == 2:
                (k1, offsets), (k2, sizes) = pairs
                if k1 == "offsets" and k2 == "sizes":
                    budget = self.budget
                    budget.spent += 3  # the chunk and its two fields
                    if budget.spent > budget.limit >= 0:
                        budget.spend(0, f"{where}.chunks[{i}]")
                    return records.ChunkStorageMetadata(
                        self.shape(offsets, where, ".chunks[", i, "].offsets"),
                        self.shape(sizes, where, ".chunks[", i, "].sizes"),
                    )
        at = f"{where}.chunks[{i}]"
        self.spend(1, at)
        fields = self.fields(value, "ChunkStorageMetadata", at)
        return records.ChunkStorageMetadata(
            offsets=self.shape(_require(fields, "offsets", at), at, ".offsets"),
            sizes=self.shape(_require(fields, "sizes", at), at, ".sizes"),
        )

    def storage_data(self, value: PickledDict) -> records.StorageData:
        self.spend(len(value.pairs), "storage_data")
        pairs = value.pairs
        rows: list[records.StorageRow] = []
        keys = list(map(operator.itemgetter(0), pairs))
        values = list(map(operator.itemgetter(1), pairs))
        read, read_values = _records(keys), _records(values)
        for start, stop, by_template in _runs(read if read_values else None, len(pairs)):
            if (
                by_template
                and read
                and read_values
                and self.take_read(
                    rows,
                    _entries_read(
                        read[start:stop],
                        read_values[start:stop],
                        keys[start:stop],
                        values[start:stop],
                    ),
                )
            ):
                continue
            for key, item in pairs[start:stop]:
                found = len(self.bad) + self.unlisted
                index = self.index(key)
                info = self.storage_info(item, index)
                if len(self.bad) + self.unlisted > found:
                    # A bad value, reported: the file is refused, and an offset that is not
                    # ints (a list among them) cannot even be a key.
                    continue
                rows.append(
                    (
                        index.fqn,
                        index.offset,
                        index.index,
                        info.relative_path,
                        info.offset,
                        info.length,
                        info.transform_descriptors,
                    )
                )
        return records.StorageData(rows)

    def index(self, value: object) -> records.MetadataIndex:
        fields = self.fields(value, "MetadataIndex", "a storage_data key")
        fqn = _require(fields, "fqn", "MetadataIndex")
        if not isinstance(fqn, str):
            raise MalformedMetadata(f"a storage_data key: fqn is a {_kind(fqn)}")
        offset = fields.get("offset")
        hint = fields.get("index")
        index = hint if hint is None or type(hint) is int else None
        if index is not hint:
            _optional(hint, int, f"storage_data[{fqn!r}] key index")  # raises, naming it
        return records.MetadataIndex(
            fqn=fqn,
            offset=None if offset is None else self.shape(offset, "", _Key(fqn), " key offset"),
            index=index,
        )

    def storage_info(self, value: object, index: records.MetadataIndex) -> records.StorageInfo:
        fields = self.fields(value, "_StorageInfo", "a storage_data value")
        path = fields.get("relative_path", _MISSING)
        offset = fields.get("offset", _MISSING)
        length = fields.get("length", _MISSING)
        if path is _MISSING or offset is _MISSING or length is _MISSING:
            where = _entry(index)
            _require(fields, "relative_path", where)
            _require(fields, "offset", where)
            _require(fields, "length", where)
        if not isinstance(path, str):
            raise MalformedMetadata(f"{_entry(index)}.relative_path: a {_kind(path)}, not a string")
        # A file position FileSystemReader seeks to and a count of bytes it reads.
        if type(offset) is not int or not 0 <= offset <= INT64_MAX:
            self.found_bad(f"{_entry(index)}.offset is {_value(offset)}: {_RANGE}")
            offset = 0
        if type(length) is not int or not 0 <= length <= INT64_MAX:
            self.found_bad(f"{_entry(index)}.length is {_value(length)}: {_RANGE}")
            length = 0
        descriptors = fields.get("transform_descriptors")
        if descriptors is not None:
            if not isinstance(descriptors, (list, tuple)):
                raise MalformedMetadata(f"{_entry(index)}.transform_descriptors: not a list")
            self.spend(len(descriptors), f"{_entry(index)}.transform_descriptors")
            if not all(isinstance(d, str) for d in descriptors):
                raise MalformedMetadata(
                    f"{_entry(index)}.transform_descriptors: not a list of strings"
                )
        return records.StorageInfo(
            relative_path=path,
            offset=offset,
            length=length,
            transform_descriptors=None if descriptors is None else tuple(map(str, descriptors)),
        )

    def storage_meta(self, value: object) -> records.StorageMeta:
        fields = self.fields(value, "StorageMeta", "Metadata.storage_meta")
        where = "StorageMeta"
        checkpoint_id = fields.get("checkpoint_id")
        if not (checkpoint_id is None or isinstance(checkpoint_id, (str, records.PathValue))):
            raise MalformedMetadata(f"{where}.checkpoint_id: a {_kind(checkpoint_id)}")
        modules = fields.get("modules", [])
        if not isinstance(modules, list):
            raise MalformedMetadata(f"{where}.modules: not a list of strings")
        self.spend(len(modules), f"{where}.modules")
        if not all(isinstance(m, str) for m in modules):
            raise MalformedMetadata(f"{where}.modules: not a list of strings")
        return records.StorageMeta(
            checkpoint_id=checkpoint_id,
            save_id=_optional(fields.get("save_id"), str, f"{where}.save_id"),
            load_id=_optional(fields.get("load_id"), str, f"{where}.load_id"),
            modules=tuple(str(m) for m in modules),
        )

    def properties(self, value: object, where: str) -> records.TensorProperties:
        if not isinstance(value, Instance) or value.cls.record != "TensorProperties":
            raise MalformedMetadata(f"{where}: a {_kind(value)}, not a TensorProperties")
        # metadata.py TensorProperties.__setstate__ unpacks (dtype, layout, requires_grad,
        # mem_format_encoding, pin_memory), and since torch 2.15 a sixth value, the strides (a
        # tuple of ints, or None), when the state holds six.
        state = value.state
        if not isinstance(state, (tuple, list)) or len(state) not in (5, 6):
            raise MalformedMetadata(
                f"{where}: its state is not the 5 (or, since torch 2.15, 6) values "
                "__setstate__ unpacks"
            )
        self.spend(len(state), where)
        dtype, layout, requires_grad, memory_format, pin_memory = state[:5]
        strides = None
        if len(state) == 6 and state[5] is not None:
            strides = self.shape(state[5], where, ".strides")
        if not isinstance(dtype, records.DType):
            raise MalformedMetadata(f"{where}.dtype: a {_kind(dtype)}, not a torch dtype")
        if not isinstance(layout, records.Layout):
            raise MalformedMetadata(f"{where}.layout: a {_kind(layout)}, not a torch layout")
        if not isinstance(memory_format, admitted.MemoryFormatEncoding):
            raise MalformedMetadata(f"{where}: the memory format is a {_kind(memory_format)}")
        if type(requires_grad) is not bool or type(pin_memory) is not bool:
            raise MalformedMetadata(f"{where}: requires_grad and pin_memory must be booleans")
        return records.TensorProperties(
            dtype, layout, requires_grad, memory_format.name, pin_memory, strides
        )

    # --- numbers ---------------------------------------------------------------------------

    def shape(self, value: object, where: str, *field: object) -> records.Shape:
        """A torch.Size (or the tuple it was pickled as): ints from 0 to 2**63 - 1, each one
        counted as work. ``where`` and ``field`` name it, joined only when it is reported."""
        if type(value) is not tuple:
            at = where + "".join(map(str, field))
            raise MalformedMetadata(f"{at}: a {_kind(value)}, not a torch.Size of integers")
        budget = self.budget
        budget.spent += len(value)
        if budget.spent > budget.limit >= 0:
            budget.spend(0, where + "".join(map(str, field)))
        for d in value:
            if type(d) is not int or d < 0 or d > INT64_MAX:
                self.bad_shape(value, where + "".join(map(str, field)))
                break
        return value

    def bad_shape(self, value: tuple[object, ...], where: str) -> None:
        for i, d in enumerate(value):
            if type(d) is not int or not 0 <= d <= INT64_MAX:
                self.found_bad(f"{where}[{i}] is {_value(d)}: {_RANGE}")
                return

    def fits(self, size: records.Shape, dtype: records.DType, where: str) -> None:
        """Whether a tensor of ``size`` and ``dtype`` can exist: its element count and its
        byte count fit int64, overflow counted as aten counts it (c10/util/safe_numerics.h
        ``safe_multiplies_u64``: once the product passes 2**64 - 1 a later 0 does not undo it;
        then aten/src/ATen/EmptyTensor.cpp ``computeStorageNbytesContiguous``)."""
        if not all(type(d) is int and 0 <= d <= INT64_MAX for d in size):
            return  # already reported, dimension by dimension
        elements = 1
        for d in size:
            elements *= d
            if elements > _U64_MAX:
                break
        itemsize = admitted.DTYPE_BYTES.get(dtype.name, 1)
        if elements > INT64_MAX or elements * itemsize > INT64_MAX:
            count = "more than 2**64" if elements > _U64_MAX else str(elements)
            self.found_bad(
                f"{where}.size {_dims(size)}: a {dtype.name} tensor of this shape holds {count} "
                f"elements of {itemsize} byte{'s' * (itemsize != 1)}, past int64 (torch cannot "
                "make it: 'Storage size calculation overflowed')"
            )

    # --- the semantics of BUILD ------------------------------------------------------------

    def fields(self, value: object, record: admitted.RecordClass, where: str) -> dict[str, object]:
        """The attributes BUILD gave the object: Lib/pickle.py ``load_build`` without
        ``__setstate__`` updates ``__dict__`` with a dict state, or with a (state, slotstate)
        pair. Each pair is counted as work: one state may be named by many objects."""
        if not isinstance(value, Instance) or value.cls.record != record:
            raise MalformedMetadata(f"{where}: a {_kind(value)}, not a {record}")
        state = value.state
        if type(state) is PickledDict:  # what DCP writes: a dict state, read in one step
            budget = self.budget
            budget.spent += len(state.pairs)
            if budget.spent > budget.limit >= 0:
                budget.spend(0, where)
            return {k: v for k, v in state.pairs if type(k) is str}
        slots: object = None
        if isinstance(state, tuple) and len(state) == 2:
            state, slots = state
        fields: dict[str, object] = {}
        for part in (state, slots):
            if part is None or part is unpickler.UNSET:
                continue
            if not isinstance(part, PickledDict):
                raise MalformedMetadata(f"{where}: the {record} state is a {_kind(part)}")
            self.spend(len(part.pairs), where)
            fields.update((k, v) for k, v in part.pairs if isinstance(k, str))
        return fields

    def str_pairs(self, value: object, where: str) -> list[tuple[str, object]]:
        if not isinstance(value, PickledDict):
            raise MalformedMetadata(f"{where}: a {_kind(value)}, not a dict")
        self.spend(len(value.pairs), where)
        merged: dict[str, object] = {}
        for key, item in value.pairs:
            if not isinstance(key, str):
                raise MalformedMetadata(f"{where}: a key that is a {_kind(key)}, not a string")
            merged[key] = item
        return list(merged.items())


_RANGE: Final = "torch and DCP hold it as an int64 from 0 to 2**63 - 1"
_RECORD: Final = operator.attrgetter("record")
_OFFSETS: Final = operator.attrgetter("offsets")
_SIZES: Final = operator.attrgetter("sizes")


def _records(values: list[object]) -> list[object] | None:
    """The ``record`` of each of ``values`` (unpickler.Instance.record: what a template read,
    while its state is deferred, so as the template read it; else None), or None if they are
    not all Instances."""
    if set(map(type, values)) != {Instance}:
        return None
    return list(map(_RECORD, values))


def _runs(made: list[object] | None, count: int) -> Iterator[tuple[int, int, bool]]:
    """The runs of records a template read (``made``, from :func:`_records`), and of the
    others: (start, stop, read by a template). A real file's are nearly all read
    by one, each list of chunks and each batch of entries beginning with one read opcode by
    opcode (and one here and there, where a FRAME begins)."""
    if made is None:
        yield 0, count, False
        return
    # Where the Nones are (``is``: list.index(None) would call each record's __eq__).
    others = list(map(operator.is_, made, itertools.repeat(None)))
    start = 0
    while start < count:
        other = others[start]
        try:
            stop = others.index(not other, start)
        except ValueError:
            stop = count
        yield start, stop, not other
        start = stop


# A run of a tensor's chunks, or of storage_data's entries, that a template read: their
# records, and the work chunk(), or index() and storage_info(), counts for them, found by map()
# over the run, at C speed; None if they are not what the template makes of one.


def _chunks_read(made: list[object]) -> tuple[list[records.ChunkStorageMetadata], int] | None:
    if set(map(type, made)) != {records.ChunkStorageMetadata}:
        return None
    chunks = cast(list[records.ChunkStorageMetadata], made)
    # chunk(): the chunk and its two fields, then each dimension.
    dims = sum(map(len, map(_OFFSETS, chunks))) + sum(map(len, map(_SIZES, chunks)))
    return chunks, 3 * len(chunks) + dims


def _entries_read(
    rows: list[object], value_rows: list[object], keys: list[object], values: list[object]
) -> tuple[list[records.StorageRow], int] | None:
    # Each key's row is its value's, the two different Instances: the template gave a key and
    # its value the one row.
    if (
        set(map(type, rows)) != {tuple}
        or not all(map(operator.is_, rows, value_rows))
        or any(map(operator.is_, keys, values))
    ):
        return None
    entries = cast(list[records.StorageRow], rows)
    # index(): the key's fields (fqn, index, and offset when there is one) and the offset's
    # dimensions; storage_info(): the value's three fields.
    offsets = list(map(operator.itemgetter(1), entries))
    dims = sum(map(len, filter(None, offsets)))
    return entries, 6 * len(entries) - offsets.count(None) + dims


class _Key:
    """``storage_data[fqn]``, written out only when something is reported about it."""

    def __init__(self, fqn: str) -> None:
        self.fqn = fqn

    def __str__(self) -> str:
        return f"storage_data[{self.fqn!r}]"


def _value(value: object) -> str:
    """A number as it can be shown: exactly up to 64 bits, by its size past them (converting a
    huge int to text is what Python's int-string limit refuses)."""
    if type(value) is not int:
        return f"a {_kind(value)}, not an integer"
    if value.bit_length() <= 64:
        return str(value)
    return f"{'-' if value < 0 else ''}an integer of {value.bit_length()} bits"


def _dims(size: records.Shape) -> str:
    """A shape to show: its first dimensions when it has many."""
    if len(size) <= MAX_LISTED_VALUES:
        return tiling.shown(size)
    return tiling.shown(size[:MAX_LISTED_VALUES])[:-1] + f", ... {len(size)} dims)"


def _entry(index: records.MetadataIndex) -> str:
    if index.offset is None:
        return f"storage_data[{index.fqn!r}]"
    return f"storage_data[{index.fqn!r} at {_dims(index.offset)}]"


def _require(fields: dict[str, object], name: str, where: str) -> object:
    # A dataclass field without a default has no class attribute to fall back on: torch's own
    # code would fail on it with AttributeError.
    value = fields.get(name, _MISSING)
    if value is _MISSING:
        raise MalformedMetadata(f"{where}: no {name}")
    return value


def _optional(value: object, kind: type[_T], where: str) -> _T | None:
    if value is None:
        return None
    if type(value) is not kind:
        raise MalformedMetadata(f"{where}: a {_kind(value)}, not a {kind.__name__}")
    return value


def _kind(value: object) -> str:
    if isinstance(value, Instance):
        return f"{value.cls.name} object"
    return type(value).__name__
