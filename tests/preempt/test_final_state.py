"""A job's final state compared without torch: safetensors tensor by tensor, other files by
bytes, directories file by file."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from dcp_invariant.preempt.final_state import first_difference


def safetensors(path: Path, tensors: dict[str, bytes]) -> None:
    header, offset = {}, 0
    for name, data in tensors.items():
        header[name] = {
            "dtype": "U8",
            "shape": [len(data)],
            "data_offsets": [offset, offset + len(data)],
        }
        offset += len(data)
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(tensors.values()))


def test_a_safetensors_file_names_the_tensor_that_differs(tmp_path: Path) -> None:
    a, b = tmp_path / "a.safetensors", tmp_path / "b.safetensors"
    safetensors(a, {"w": b"\x01\x02", "v": b"\x03"})
    safetensors(b, {"w": b"\x01\x02", "v": b"\x04"})
    assert first_difference(a, b) == "a.safetensors: tensor 'v': its dtype, shape or bytes differ"
    safetensors(b, {"w": b"\x01\x02", "v": b"\x03"})
    assert first_difference(a, b) is None


def test_directories_are_compared_file_by_file(tmp_path: Path) -> None:
    for side, data in (("x", b"1"), ("y", b"2")):
        (tmp_path / side / "sub").mkdir(parents=True)
        (tmp_path / side / "sub" / "f.bin").write_bytes(data)
        (tmp_path / side / "same").write_bytes(b"s")
    assert first_difference(tmp_path / "x", tmp_path / "y") == "sub/f.bin: its bytes differ"
    (tmp_path / "y" / "extra").write_bytes(b"")
    (tmp_path / "y" / "sub" / "f.bin").write_bytes(b"1")
    assert (
        first_difference(tmp_path / "x", tmp_path / "y") == "extra: not in the uninterrupted run's"
    )
    assert first_difference(tmp_path / "x", tmp_path / "missing") == "it is missing"
