"""``.metadata`` of any size pickled as ``pickle.dump`` pickles torch's objects, torch-free.

:mod:`metadata_pickler` writes no memo; DCP's files are written by ``pickle.dump`` of torch's
objects (torch/distributed/checkpoint/filesystem.py ``FileSystemWriter.finish``), which names
each class, field name and file name once and then by memo reference, shares what is one
object, and cuts the stream into 64 KiB frames. The interpreter's templates
(``unpickler._Templates``) read exactly that, so their tests need files like it, larger than the
checked-in ones and of every shape: this pickles stand-ins with torch's names, fields and
``__getstate__`` (torch/distributed/checkpoint/metadata.py and filesystem.py, torch 2.13.0) with
Lib/pickle.py's own pickler, whose output for them is the C pickler's. Only the globals are
written by hand, as ``save_global`` writes them, under torch's module names.
"""

from __future__ import annotations

import io
import pickle
from pathlib import PurePosixPath
from typing import Any

from dcp_invariant.inspection.admitted import DCP_FILESYSTEM, DCP_METADATA

# Where each stand-in, or stand-in class, is written as a global (module, name).
_GLOBALS: dict[int, tuple[str, str]] = {}


class _Global:
    """A global that is not a class here: a reducer (torch.Size) or a dtype."""

    def __init__(self, module: str, name: str) -> None:
        _GLOBALS[id(self)] = (module, name)
        self.name = name

    def __reduce__(self) -> str:
        return self.name  # pickle writes it by save_global, as torch's globals are

    def __call__(self, *args: object) -> None:
        """Never called: pickle asks that what it reduces with be callable."""


SIZE = _Global("torch", "Size")
_GET_LAYOUT = _Global("torch.serialization", "_get_layout")
_MEM_FORMAT_ENCODING = _Global(DCP_METADATA, "_MEM_FORMAT_ENCODING")
FLOAT32 = _Global("torch", "float32")
BFLOAT16 = _Global("torch", "bfloat16")


def _torch(module: str) -> Any:
    def register(cls: type) -> type:
        _GLOBALS[id(cls)] = (module, cls.__name__)
        return cls

    return register


class Size(tuple[int, ...]):
    """torch.Size: ``__reduce__`` gives (torch.Size, (tuple(self),))."""

    def __reduce__(self) -> tuple[object, tuple[tuple[int, ...]]]:
        return SIZE, (tuple(self),)


class _Layout:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        # torch/serialization.py: copyreg.pickle(torch.layout, lambda obj: (_get_layout, (str(obj),)))
        return _GET_LAYOUT, ("torch.strided",)


class _ContiguousFormat:
    def __reduce__(self) -> tuple[object, tuple[int]]:
        return _MEM_FORMAT_ENCODING, (0,)  # an Enum: (its class, (its value,))


STRIDED = _Layout()
CONTIGUOUS = _ContiguousFormat()


@_torch(DCP_METADATA)
class ChunkStorageMetadata:
    def __init__(self, offsets: Size, sizes: Size) -> None:
        self.offsets = offsets
        self.sizes = sizes


@_torch(DCP_METADATA)
class TensorProperties:
    def __init__(self, dtype: _Global) -> None:
        self.dtype = dtype

    def __getstate__(self) -> tuple[object, ...]:
        # dtype, layout, requires_grad, the memory format's encoding, pin_memory
        return self.dtype, STRIDED, False, CONTIGUOUS, False


@_torch(DCP_METADATA)
class TensorStorageMetadata:
    def __init__(
        self, properties: TensorProperties, size: Size, chunks: list[ChunkStorageMetadata]
    ) -> None:
        self.properties = properties
        self.size = size
        self.chunks = chunks


@_torch(DCP_METADATA)
class BytesStorageMetadata:
    pass


@_torch(DCP_METADATA)
class MetadataIndex:
    def __init__(self, fqn: str, offset: Size | None = None, index: int | None = None) -> None:
        # torch's __init__ sets fqn, index, then offset only when there is one.
        self.fqn = fqn
        self.index = index
        if offset is not None:
            self.offset = Size(offset)


@_torch(DCP_FILESYSTEM)
class _StorageInfo:
    def __init__(self, relative_path: str, offset: int, length: int) -> None:
        self.relative_path = relative_path
        self.offset = offset
        self.length = length
        self.transform_descriptors = None

    def __getstate__(self) -> dict[str, object]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@_torch(DCP_METADATA)
class StorageMeta:
    def __init__(self, checkpoint_id: object) -> None:
        self.checkpoint_id = checkpoint_id
        self.save_id = "a-save-id"
        self.load_id = None
        self.modules: list[str] = []


@_torch(DCP_METADATA)
class Metadata:
    def __init__(self, state: dict[str, object], storage: dict[object, object]) -> None:
        self.state_dict_metadata = state
        self.planner_data = None
        self.storage_data = storage
        self.storage_meta = StorageMeta(PurePosixPath("/checkpoint"))
        self.version = "1.0.0"


# Lib/pickle.py's pure-Python pickler: its save, write and memoize are not in the stubs.
_PURE: Any = pickle._Pickler


class _Pickler(pickle._Pickler):
    def save_global(self, obj: Any, name: str | None = None) -> None:
        names = _GLOBALS.get(id(obj))
        if names is None:
            _PURE.save_global(self, obj, name)
            return
        # As Lib/pickle.py's save_global writes a global from protocol 4 on.
        pickler: Any = self
        pickler.save(names[0])
        pickler.save(names[1])
        pickler.write(pickle.STACK_GLOBAL)
        pickler.memoize(obj)


# The tensors of a model, each (name, shape, dtype): sharded along dim 0 over the ranks as
# fully_shard shards them, a 0-d one and byte items saved whole by rank 0.
MODEL: tuple[tuple[str, tuple[int, ...], _Global], ...] = (
    ("embed.weight", (1000, 64), BFLOAT16),
    ("layers.0.conv.weight", (48, 3, 5, 5), FLOAT32),  # four dimensions: MARK ... TUPLE
    ("layers.0.attn.weight", (96, 64, 2), FLOAT32),  # three: TUPLE3
    ("layers.0.norm.weight", (64,), FLOAT32),  # one: TUPLE1
    ("layers.0.mlp.weight", (2**21, 4096), BFLOAT16),  # 16 GiB: offsets past 2**31 (LONG1)
    ("layers.0.mlp.bias", (5,), FLOAT32),  # fewer rows than ranks: empty chunks
    ("step", (), FLOAT32),  # 0-d: EMPTY_TUPLE
)
BYTE_ITEMS = ("extra.epoch", "extra.config")


def dumps(world_size: int, layers: int = 1) -> bytes:
    """The ``.metadata`` of :data:`MODEL`, its layers repeated ``layers`` times, saved by
    ``world_size`` ranks, as DCP's global plan and ``FileSystemWriter.finish`` pickle it."""
    tensors = [
        (name.replace("layers.0.", f"layers.{layer}."), shape, dtype)
        for layer in range(layers)
        for name, shape, dtype in MODEL
        if layer == 0 or "layers." in name
    ]
    state: dict[str, object] = {}
    written: list[list[tuple[MetadataIndex, int]]] = [[] for _ in range(world_size)]
    for name, shape, dtype in tensors:
        chunks = []
        if not shape:
            chunks.append(ChunkStorageMetadata(Size(()), Size(())))
            written[0].append((MetadataIndex(name, Size(()), 0), 4))
        else:
            rows, rest = shape[0], shape[1:]
            per = -(-rows // world_size)  # torch.chunk along dim 0
            for rank in range(world_size):
                low, high = min(rows, rank * per), min(rows, (rank + 1) * per)
                chunk = ChunkStorageMetadata(
                    Size((low, *[0] * len(rest))), Size((high - low, *rest))
                )
                chunks.append(chunk)
                numel = (high - low) * _product(rest)
                written[rank].append(
                    (MetadataIndex(f"{name}", Size(chunk.offsets), rank), 2 * numel)
                )
        state[name] = TensorStorageMetadata(TensorProperties(dtype), Size(shape), chunks)
    for item in BYTE_ITEMS:
        state[item] = BytesStorageMetadata()
        written[0].append((MetadataIndex(item), 57))
    storage: dict[object, object] = {}
    for rank, items in enumerate(written):
        path = f"__{rank}_0.distcp"  # one string a file: named once, then referenced
        at = 0
        for index, length in items:
            # Each rank's results reach rank 0 pickled: its names are strings of their own.
            index.fqn = "".join(index.fqn)
            storage[index] = _StorageInfo(path, at, length)
            at += length
    out = io.BytesIO()
    _Pickler(out, protocol=4).dump(Metadata(state, storage))
    return out.getvalue()


def _product(values: tuple[int, ...]) -> int:
    result = 1
    for value in values:
        result *= value
    return result
