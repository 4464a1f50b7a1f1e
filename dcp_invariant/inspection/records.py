"""What a DCP ``.metadata`` holds, as plain records: one per class DCP pickles into it.

Each mirrors a class of ``torch/distributed/checkpoint/metadata.py`` (or ``_StorageInfo`` of
``filesystem.py``) field by field, as torch 2.11.0 to 2.14.1 define them (the file is the same in
each of them, and its pickle names the same globals; see :mod:`.admitted`). Nothing here is
built by calling torch: :mod:`.metadata` fills these in from the opcodes of the pickle.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

# torch.Size: a tuple of ints. Kept as a plain tuple, as its pickle is ``torch.Size((10, 8))``.
Shape: TypeAlias = tuple[int, ...]
# torch.Size, the offsets of a chunk and _StorageInfo's offset and length are int64 in torch
# (c10's IntArrayRef; FileSystemReader seeks and reads them as file positions): none is negative.
INT64_MAX: Final = (1 << 63) - 1


@dataclass(frozen=True)
class DType:
    """``torch.float32`` and the like: a global the pickle names, never called."""

    name: str


@dataclass(frozen=True)
class Layout:
    """``torch.strided`` and the like: pickled as ``torch.serialization._get_layout(name)``."""

    name: str


# metadata.py's _MEM_FORMAT_ENCODING: TensorProperties pickles its memory format as this enum.
MemoryFormat = Literal["contiguous_format", "channels_last", "preserve_format"]
MEMORY_FORMATS: tuple[MemoryFormat, ...] = ("contiguous_format", "channels_last", "preserve_format")


@dataclass(frozen=True)
class PathValue:
    """A ``pathlib`` path (``StorageMeta.checkpoint_id``), kept as the parts it was pickled with."""

    kind: str  # PosixPath, WindowsPath, ...
    parts: tuple[str, ...]


@dataclass(frozen=True)
class TensorProperties:
    dtype: DType
    layout: Layout
    requires_grad: bool
    memory_format: MemoryFormat
    pin_memory: bool
    # torch 2.15 adds the tensor's strides as a sixth value of the state (None when unknown);
    # earlier releases pickle five (torch/distributed/checkpoint/metadata.py).
    strides: Shape | None = None


@dataclass(frozen=True)
class ChunkStorageMetadata:
    offsets: Shape
    sizes: Shape


@dataclass(frozen=True)
class TensorStorageMetadata:
    properties: TensorProperties
    size: Shape
    chunks: tuple[ChunkStorageMetadata, ...]


@dataclass(frozen=True)
class BytesStorageMetadata:
    """A non-tensor value (an int, a string, a dict...), saved with ``torch.save`` into a shard."""


StorageMetadata: TypeAlias = TensorStorageMetadata | BytesStorageMetadata


@dataclass(frozen=True)
class MetadataIndex:
    """The key of ``storage_data``: as in torch, ``index`` is a hint left out of equality."""

    fqn: str
    offset: Shape | None = None
    index: int | None = field(default=None, compare=False, hash=False)


@dataclass(frozen=True)
class StorageInfo:
    """filesystem.py's ``_StorageInfo``: where an item's bytes lie."""

    relative_path: str
    offset: int
    length: int
    transform_descriptors: tuple[str, ...] | None = None


# One entry of storage_data: the key's fqn, offset and index, then the value's relative_path,
# offset, length and transform_descriptors.
StorageRow: TypeAlias = tuple[str, Shape | None, int | None, str, int, int, tuple[str, ...] | None]
_FQN: Final = operator.itemgetter(0)
_KEY_OFFSET: Final = operator.itemgetter(1)
_PATH: Final = operator.itemgetter(3)
_START: Final = operator.itemgetter(4)
_LENGTH: Final = operator.itemgetter(5)


class StorageData(Mapping[MetadataIndex, StorageInfo]):
    """``storage_data`` as :mod:`.metadata` reads it: MetadataIndex to StorageInfo, one row
    an entry.

    A checkpoint holds an entry a chunk, millions of them: as a dict of records each is four
    objects, its key hashed by a Python call, and the checks read a field or two of each. So
    an entry is one tuple (:data:`StorageRow`), the checks read columns of them, and the
    records are made when they are asked for (iteration, lookup). It is the dict
    ``pickle.load`` builds: a key seen again (MetadataIndex compares fqn and offset) keeps its
    place and its first index hint, and takes the later value.
    """

    __slots__ = ("_rows", "_where")

    def __init__(self, rows: Iterable[StorageRow] = ()) -> None:
        rows = list(rows)
        keys = zip(map(_FQN, rows), map(_KEY_OFFSET, rows), strict=True)
        self._rows = rows
        self._where: dict[tuple[str, Shape | None], int] = dict(zip(keys, itertools.count()))
        if len(self._where) != len(rows):  # a key seen again: one at a time, as dict does
            self._rows, self._where = [], {}
            for row in rows:
                self.add(row)

    @classmethod
    def of(cls, storage: Mapping[MetadataIndex, StorageInfo]) -> StorageData:
        """``storage`` as rows: itself if it is, else copied (a mapping made by hand)."""
        if isinstance(storage, StorageData):
            return storage
        return cls(
            (
                key.fqn,
                key.offset,
                key.index,
                info.relative_path,
                info.offset,
                info.length,
                info.transform_descriptors,
            )
            for key, info in storage.items()
        )

    def add(self, row: StorageRow) -> None:
        rows = self._rows
        at = self._where.setdefault((row[0], row[1]), len(rows))
        if at == len(rows):
            rows.append(row)
        else:  # the key it has, the value it is given
            rows[at] = rows[at][:3] + row[3:]

    # A field of every entry, in order.

    def fqns(self) -> list[str]:
        return list(map(_FQN, self._rows))

    def paths(self) -> list[str]:
        return list(map(_PATH, self._rows))

    def starts(self) -> list[int]:
        return list(map(_START, self._rows))

    def lengths(self) -> list[int]:
        return list(map(_LENGTH, self._rows))

    def keys_present(self) -> Collection[tuple[str, Shape | None]]:
        """The (fqn, offset) of every key: what MetadataIndex compares."""
        return self._where.keys()

    def __getitem__(self, key: MetadataIndex) -> StorageInfo:
        if not isinstance(key, MetadataIndex):
            raise KeyError(key)
        row = self._rows[self._where[(key.fqn, key.offset)]]
        return StorageInfo(row[3], row[4], row[5], row[6])

    def __contains__(self, key: object) -> bool:
        return isinstance(key, MetadataIndex) and (key.fqn, key.offset) in self._where

    def __iter__(self) -> Iterator[MetadataIndex]:
        for row in self._rows:
            yield MetadataIndex(row[0], row[1], row[2])

    def __len__(self) -> int:
        return len(self._rows)

    def __repr__(self) -> str:
        return f"StorageData({dict(self)!r})"


@dataclass(frozen=True)
class StorageMeta:
    checkpoint_id: str | PathValue | None = None
    save_id: str | None = None
    load_id: str | None = None
    modules: tuple[str, ...] = ()


@dataclass(frozen=True)
class Metadata:
    state_dict_metadata: Mapping[str, StorageMetadata]
    # FileSystemWriter's storage_data; another storage writer may keep something else here, in
    # which case this is None and ``storage_kind`` names what was found.
    storage_data: Mapping[MetadataIndex, StorageInfo] | None
    storage_kind: str
    storage_meta: StorageMeta | None
    version: str | None
