"""``.metadata`` as typed records: read with a bound, interpreted without pickle, then checked
field by field against the shape of torch's classes.

The interpreter (:mod:`.unpickler`) gives the stand-ins torch's unpickling would have built;
this turns them into :mod:`.records`, with the semantics torch gives them on loading: BUILD of
a dataclass updates its ``__dict__`` (a field left out keeps its class default, if it has one),
``TensorProperties.__setstate__`` unpacks a 5-tuple (6 since torch 2.15: the strides), and a dict keeps the last value of a key
seen twice (``MetadataIndex`` compares ``fqn`` and ``offset`` only).

Conversions are cached per object, so a pickle that refers to one big list many times through
its memo is converted once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar

from dcp_invariant import regular_file
from dcp_invariant.inspect import admitted, records, unpickler
from dcp_invariant.inspect.errors import MalformedMetadata, MetadataTooLarge
from dcp_invariant.inspect.unpickler import Instance, PickledDict

METADATA_FILE: Final = ".metadata"
# A .metadata is read whole; larger than this, it is refused unread. DCP's grows by a few hundred
# bytes per chunk: 512 MiB is millions of chunks.
MAX_METADATA_BYTES: Final = 512 << 20

_T = TypeVar("_T")
_MISSING: Final = object()


def read(path: Path, *, bound: int = MAX_METADATA_BYTES) -> records.Metadata:
    """Read and interpret the ``.metadata`` at ``path``.

    Raises a :class:`MetadataProblem` (a refused, malformed or oversized pickle) and the
    ``OSError``\\ s of :func:`regular_file.read` (including :class:`regular_file.NotRegularFile`).
    """
    try:
        data = regular_file.read(path, bound=bound)
    except regular_file.OverBound as exc:
        shown = f"{bound >> 20} MiB" if bound % (1 << 20) == 0 else f"{bound}-byte"
        raise MetadataTooLarge(
            f"{METADATA_FILE} is over the {shown} bound; it was not read"
        ) from exc
    return parse(data)


def parse(data: bytes) -> records.Metadata:
    """Interpret the bytes of a ``.metadata``: :class:`MetadataProblem` if they are not one."""
    return _Converter().metadata(unpickler.load(data))


class _Converter:
    def __init__(self) -> None:
        self.cache: dict[tuple[int, str], object] = {}

    def cached(self, kind: str, value: object, convert: Callable[[], _T]) -> _T:
        key = (id(value), kind)
        if key not in self.cache:
            self.cache[key] = convert()
        return self.cache[key]  # type: ignore[return-value]

    # --- the records -----------------------------------------------------------------------

    def metadata(self, value: object) -> records.Metadata:
        fields = _fields(value, "Metadata", "the pickle")
        entries = _require(fields, "state_dict_metadata", "Metadata")
        state_dict = {
            key: self.storage(item, f"state_dict_metadata[{key!r}]")
            for key, item in _str_pairs(entries, "state_dict_metadata")
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
            _fields(value, "BytesStorageMetadata", where)
            return records.BytesStorageMetadata()
        return self.cached("tensor", value, lambda: self.tensor(value, where))

    def tensor(self, value: object, where: str) -> records.TensorStorageMetadata:
        fields = _fields(value, "TensorStorageMetadata", where)
        chunks = _require(fields, "chunks", where)
        if not isinstance(chunks, list):
            raise MalformedMetadata(f"{where}.chunks: a {_kind(chunks)}, not a list")
        return records.TensorStorageMetadata(
            properties=self.cached(
                "properties",
                _require(fields, "properties", where),
                lambda: _properties(fields["properties"], f"{where}.properties"),
            ),
            size=_shape(_require(fields, "size", where), f"{where}.size"),
            chunks=self.cached(
                "chunks",
                chunks,
                lambda: tuple(_chunk(c, f"{where}.chunks[{i}]") for i, c in enumerate(chunks)),
            ),
        )

    def storage_data(self, value: PickledDict) -> dict[records.MetadataIndex, records.StorageInfo]:
        out: dict[records.MetadataIndex, records.StorageInfo] = {}
        for key, item in value.pairs:
            index = self.index(key)
            out[index] = self.storage_info(item, f"storage_data[{index.fqn!r}]")
        return out

    def index(self, value: object) -> records.MetadataIndex:
        return self.cached("index", value, lambda: _index(value))

    def storage_info(self, value: object, where: str) -> records.StorageInfo:
        return self.cached("info", value, lambda: _storage_info(value, where))

    def storage_meta(self, value: object) -> records.StorageMeta:
        fields = _fields(value, "StorageMeta", "Metadata.storage_meta")
        where = "StorageMeta"
        checkpoint_id = fields.get("checkpoint_id")
        if not (checkpoint_id is None or isinstance(checkpoint_id, (str, records.PathValue))):
            raise MalformedMetadata(f"{where}.checkpoint_id: a {_kind(checkpoint_id)}")
        modules = fields.get("modules", [])
        if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
            raise MalformedMetadata(f"{where}.modules: not a list of strings")
        return records.StorageMeta(
            checkpoint_id=checkpoint_id,
            save_id=_optional(fields.get("save_id"), str, f"{where}.save_id"),
            load_id=_optional(fields.get("load_id"), str, f"{where}.load_id"),
            modules=tuple(str(m) for m in modules),
        )


def _properties(value: object, where: str) -> records.TensorProperties:
    if not isinstance(value, Instance) or value.cls.record != "TensorProperties":
        raise MalformedMetadata(f"{where}: a {_kind(value)}, not a TensorProperties")
    # metadata.py TensorProperties.__setstate__ unpacks (dtype, layout, requires_grad,
    # mem_format_encoding, pin_memory), and since torch 2.15 a sixth value, the strides (a
    # tuple of ints, or None), when the state holds six.
    state = value.state
    if not isinstance(state, (tuple, list)) or len(state) not in (5, 6):
        raise MalformedMetadata(
            f"{where}: its state is not the 5 (or, since torch 2.15, 6) values __setstate__ unpacks"
        )
    dtype, layout, requires_grad, memory_format, pin_memory = state[:5]
    strides = None if len(state) == 5 or state[5] is None else _shape(state[5], f"{where}.strides")
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


def _chunk(value: object, where: str) -> records.ChunkStorageMetadata:
    fields = _fields(value, "ChunkStorageMetadata", where)
    return records.ChunkStorageMetadata(
        offsets=_shape(_require(fields, "offsets", where), f"{where}.offsets"),
        sizes=_shape(_require(fields, "sizes", where), f"{where}.sizes"),
    )


def _index(value: object) -> records.MetadataIndex:
    fields = _fields(value, "MetadataIndex", "a storage_data key")
    fqn = _require(fields, "fqn", "MetadataIndex")
    if not isinstance(fqn, str):
        raise MalformedMetadata(f"a storage_data key: fqn is a {_kind(fqn)}")
    offset = fields.get("offset")
    where = f"storage_data[{fqn!r}]"
    index = fields.get("index")
    return records.MetadataIndex(
        fqn=fqn,
        offset=None if offset is None else _shape(offset, f"{where} key offset"),
        index=_optional(index, int, f"{where} key index"),
    )


def _storage_info(value: object, where: str) -> records.StorageInfo:
    fields = _fields(value, "_StorageInfo", where)
    path = _require(fields, "relative_path", where)
    offset = _require(fields, "offset", where)
    length = _require(fields, "length", where)
    if not isinstance(path, str):
        raise MalformedMetadata(f"{where}.relative_path: a {_kind(path)}, not a string")
    if type(offset) is not int or type(length) is not int:
        raise MalformedMetadata(f"{where}: offset and length must be integers")
    descriptors = fields.get("transform_descriptors")
    if descriptors is not None and not (
        isinstance(descriptors, (list, tuple)) and all(isinstance(d, str) for d in descriptors)
    ):
        raise MalformedMetadata(f"{where}.transform_descriptors: not a list of strings")
    return records.StorageInfo(
        relative_path=path,
        offset=offset,
        length=length,
        transform_descriptors=None if descriptors is None else tuple(map(str, descriptors)),
    )


# --- the semantics of BUILD ----------------------------------------------------------------


def _fields(value: object, record: admitted.RecordClass, where: str) -> dict[str, object]:
    """The attributes BUILD gave the object: Lib/pickle.py ``load_build`` without
    ``__setstate__`` updates ``__dict__`` with a dict state, or with a (state, slotstate) pair."""
    if not isinstance(value, Instance) or value.cls.record != record:
        raise MalformedMetadata(f"{where}: a {_kind(value)}, not a {record}")
    state = value.state
    slots: object = None
    if isinstance(state, tuple) and len(state) == 2:
        state, slots = state
    fields: dict[str, object] = {}
    for part in (state, slots):
        if part is None or part is unpickler.UNSET:
            continue
        if not isinstance(part, PickledDict):
            raise MalformedMetadata(f"{where}: the {record} state is a {_kind(part)}")
        fields.update((k, v) for k, v in part.pairs if isinstance(k, str))
    return fields


def _require(fields: dict[str, object], name: str, where: str) -> object:
    # A dataclass field without a default has no class attribute to fall back on: torch's own
    # code would fail on it with AttributeError.
    value = fields.get(name, _MISSING)
    if value is _MISSING:
        raise MalformedMetadata(f"{where}: no {name}")
    return value


def _str_pairs(value: object, where: str) -> list[tuple[str, object]]:
    if not isinstance(value, PickledDict):
        raise MalformedMetadata(f"{where}: a {_kind(value)}, not a dict")
    merged: dict[str, object] = {}
    for key, item in value.pairs:
        if not isinstance(key, str):
            raise MalformedMetadata(f"{where}: a key that is a {_kind(key)}, not a string")
        merged[key] = item
    return list(merged.items())


def _shape(value: object, where: str) -> records.Shape:
    if isinstance(value, tuple) and all(type(d) is int for d in value):
        return value
    raise MalformedMetadata(f"{where}: a {_kind(value)}, not a torch.Size of integers")


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
