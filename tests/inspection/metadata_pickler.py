"""A minimal pickler of :mod:`dcp_invariant.inspection.records`, writing what DCP writes, torch-free.

Edited metadata for the tests: parse a real ``.metadata``, change the records, pickle them back.
Each record is written the way ``pickle.dump`` writes torch's class (measured from torch
2.13.0's files): ``cls.__new__`` by NEWOBJ then BUILD with its ``__dict__`` (TensorProperties
with the 5-tuple of its ``__getstate__``), ``torch.Size`` and the rest by REDUCE. No memo is
written; protocols 2 to 5 are supported (below 4 with GLOBAL instead of STACK_GLOBAL).

:func:`memo_bomb` writes what ``pickle.dump`` never does: one chunk named again and again
through the memo.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from dcp_invariant.inspection import records
from dcp_invariant.inspection.admitted import DCP_FILESYSTEM, DCP_METADATA

_FORMAT_CODES = {name: code for code, name in enumerate(records.MEMORY_FORMATS)}


def dumps(metadata: records.Metadata, protocol: int = 4) -> bytes:
    writer = Writer(protocol)
    writer.metadata(metadata)
    return b"\x80" + bytes([protocol]) + b"".join(writer.out) + b"."


class Writer:
    def __init__(self, protocol: int) -> None:
        assert 2 <= protocol <= 5
        self.protocol = protocol
        self.out: list[bytes] = []

    def op(self, data: bytes) -> None:
        self.out.append(data)

    # --- values --------------------------------------------------------------------------

    def value(self, value: object) -> None:
        if value is None:
            self.op(b"N")
        elif value is True or value is False:
            self.op(b"\x88" if value else b"\x89")
        elif isinstance(value, int):
            self.int_(value)
        elif isinstance(value, str):
            raw = value.encode("utf-8", "surrogatepass")
            if len(raw) < 256 and self.protocol >= 4:
                self.op(b"\x8c" + bytes([len(raw)]) + raw)
            else:
                self.op(b"X" + struct.pack("<I", len(raw)) + raw)
        elif isinstance(value, tuple):
            self.tuple_(value)
        elif isinstance(value, list):
            self.op(b"]")
            if value:
                self.op(b"(")
                for item in value:
                    self.value(item)
                self.op(b"e")
        elif isinstance(value, dict):
            self.dict_(value)
        elif isinstance(value, records.DType):
            self.global_("torch", value.name)
        elif isinstance(value, records.PathValue):
            self.reduce("pathlib", value.kind, value.parts)
        else:
            raise TypeError(f"cannot pickle {type(value).__name__}")

    def int_(self, value: int) -> None:
        if 0 <= value < 256:
            self.op(b"K" + bytes([value]))
        elif 0 <= value < 65536:
            self.op(b"M" + struct.pack("<H", value))
        elif -(2**31) <= value < 2**31:
            self.op(b"J" + struct.pack("<i", value))
        else:
            raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            if len(raw) < 256:
                self.op(b"\x8a" + bytes([len(raw)]) + raw)  # LONG1
            else:
                self.op(b"\x8b" + struct.pack("<i", len(raw)) + raw)  # LONG4

    def tuple_(self, items: tuple[object, ...]) -> None:
        if len(items) <= 3:
            for item in items:
                self.value(item)
            self.op([b")", b"\x85", b"\x86", b"\x87"][len(items)])
        else:
            self.op(b"(")
            for item in items:
                self.value(item)
            self.op(b"t")

    def dict_(self, items: Mapping[Any, object]) -> None:
        self.op(b"}")
        if items:
            self.op(b"(")
            for key, item in items.items():
                self.value(key)
                self.value(item)
            self.op(b"u")

    def global_(self, module: str, name: str) -> None:
        if self.protocol >= 4:
            self.value(module)
            self.value(name)
            self.op(b"\x93")
        else:
            self.op(b"c" + module.encode() + b"\n" + name.encode() + b"\n")

    def reduce(self, module: str, name: str, args: tuple[object, ...]) -> None:
        self.global_(module, name)
        self.tuple_(args)
        self.op(b"R")

    def size(self, shape: records.Shape) -> None:
        self.reduce("torch", "Size", (shape,))

    def new(
        self, name: str, state: Mapping[str, object] | None, module: str = DCP_METADATA
    ) -> None:
        self.global_(module, name)
        self.op(b")\x81")  # EMPTY_TUPLE NEWOBJ: cls.__new__(cls)
        if state is not None:
            self.dict_(state)
            self.op(b"b")

    # --- records -------------------------------------------------------------------------

    def metadata(self, m: records.Metadata) -> None:
        self.global_(DCP_METADATA, "Metadata")
        self.op(b")\x81}(")
        self.value("state_dict_metadata")
        self.op(b"}")
        if m.state_dict_metadata:
            self.op(b"(")
            for key, item in m.state_dict_metadata.items():
                self.value(key)
                self.storage(item)
            self.op(b"u")
        self.value("planner_data")
        self.op(b"N")
        self.value("storage_data")
        if m.storage_data is None:
            self.op(b"N")
        else:
            self.op(b"}")
            if m.storage_data:
                self.op(b"(")
                for index, info in m.storage_data.items():
                    self.index(index)
                    self.info(info)
                self.op(b"u")
        self.value("storage_meta")
        if m.storage_meta is None:
            self.op(b"N")
        else:
            s = m.storage_meta
            self.new(
                "StorageMeta",
                {
                    "checkpoint_id": s.checkpoint_id,
                    "save_id": s.save_id,
                    "load_id": s.load_id,
                    "modules": list(s.modules),
                },
            )
        self.value("version")
        self.value(m.version)
        self.op(b"ub")

    def storage(self, item: records.StorageMetadata) -> None:
        if isinstance(item, records.BytesStorageMetadata):
            self.new("BytesStorageMetadata", None)  # DCP's files build it with no BUILD
            return
        self.global_(DCP_METADATA, "TensorStorageMetadata")
        self.op(b")\x81}(")
        self.value("properties")
        self.properties(item.properties)
        self.value("size")
        self.size(item.size)
        self.value("chunks")
        self.op(b"]")
        if item.chunks:
            self.op(b"(")
            for chunk in item.chunks:
                self.chunk(chunk)
            self.op(b"e")
        self.op(b"ub")

    def chunk(self, chunk: records.ChunkStorageMetadata) -> None:
        self.global_(DCP_METADATA, "ChunkStorageMetadata")
        self.op(b")\x81}(")
        self.value("offsets")
        self.size(chunk.offsets)
        self.value("sizes")
        self.size(chunk.sizes)
        self.op(b"ub")

    def properties(self, p: records.TensorProperties) -> None:
        self.global_(DCP_METADATA, "TensorProperties")
        self.op(b")\x81(")
        self.value(p.dtype)
        self.reduce("torch.serialization", "_get_layout", (f"torch.{p.layout.name}",))
        self.value(p.requires_grad)
        self.reduce(DCP_METADATA, "_MEM_FORMAT_ENCODING", (_FORMAT_CODES[p.memory_format],))
        self.value(p.pin_memory)
        if p.strides is not None:  # torch 2.15's sixth value
            self.tuple_(p.strides)
        self.op(b"tb")

    def index(self, index: records.MetadataIndex) -> None:
        self.global_(DCP_METADATA, "MetadataIndex")
        self.op(b")\x81}(")
        self.value("fqn")
        self.value(index.fqn)
        self.value("offset")
        if index.offset is None:
            self.op(b"N")
        else:
            self.size(index.offset)
        self.value("index")
        self.value(index.index)
        self.op(b"ub")

    def info(self, info: records.StorageInfo) -> None:
        state: dict[str, object] = {
            "relative_path": info.relative_path,
            "offset": info.offset,
            "length": info.length,
        }
        if info.transform_descriptors is not None:
            state["transform_descriptors"] = list(info.transform_descriptors)
        self.new("_StorageInfo", state, module=DCP_FILESYSTEM)


def memo_bomb(dims: int, references: int) -> bytes:
    """A ``.metadata`` whose one tensor lists one chunk of ``dims`` dimensions ``references``
    times, each a two- or five-byte memo reference: ``dims * references`` dimensions."""
    w = Writer(4)
    w.global_(DCP_METADATA, "Metadata")
    w.op(b")\x81}(")
    w.value("state_dict_metadata")
    w.op(b"}(")
    w.value("bomb")
    w.global_(DCP_METADATA, "TensorStorageMetadata")
    w.op(b")\x81}(")
    w.value("properties")
    w.properties(
        records.TensorProperties(
            records.DType("uint8"), records.Layout("strided"), False, "contiguous_format", False
        )
    )
    w.value("size")
    w.global_("torch", "Size")
    w.op(b"(" + b"K\x00" * dims + b"t\x94")  # the dimensions, all 0: memo entry 0
    w.op(b"\x85R")
    w.value("chunks")
    w.op(b"](")
    w.global_(DCP_METADATA, "ChunkStorageMetadata")
    w.op(b")\x81}(")
    w.value("offsets")
    w.global_("torch", "Size")
    w.op(b"h\x00\x85R")
    w.value("sizes")
    w.global_("torch", "Size")
    w.op(b"h\x00\x85R")  # the same dimensions again
    w.op(b"ub\x94")  # the chunk: memo entry 1
    w.op(b"h\x01" * (references - 1))
    w.op(b"eub")
    w.op(b"u")
    w.value("storage_data")
    w.op(b"}")
    w.value("version")
    w.value("1.0.0")
    w.op(b"ub")
    return b"\x80\x04" + b"".join(w.out) + b"."
