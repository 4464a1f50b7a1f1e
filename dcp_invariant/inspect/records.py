"""What a DCP ``.metadata`` holds, as plain records: one per class DCP pickles into it.

Each mirrors a class of ``torch/distributed/checkpoint/metadata.py`` (or ``_StorageInfo`` of
``filesystem.py``) field by field, as torch 2.11.0 to 2.14.1 define them (the file is the same in
each of them, and its pickle names the same globals; see :mod:`.admitted`). Nothing here is
built by calling torch: :mod:`.metadata` fills these in from the opcodes of the pickle.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

# torch.Size: a tuple of ints. Kept as a plain tuple, as its pickle is ``torch.Size((10, 8))``.
Shape: TypeAlias = tuple[int, ...]


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
