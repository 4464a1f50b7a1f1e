"""The pointer record and its all-or-nothing replacement."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from dcp_invariant import canonical
from dcp_invariant.commit import PointerError, pointer
from dcp_invariant.commit.pointer import Pointer

OLD = Pointer("step-1", "a" * 64, 1)
NEW = Pointer("step-2", "b" * 64, 2)


def test_write_then_read_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "pointer.json"
    pointer.write(path, OLD)
    assert pointer.read(path) == OLD
    pointer.write(path, NEW)
    assert pointer.read(path) == NEW


def test_bytes_on_disk_are_the_canonical_record(tmp_path: Path) -> None:
    path = tmp_path / "pointer.json"
    pointer.write(path, NEW)
    raw = path.read_bytes()
    # canonical.loads refuses any byte form but the canonical one.
    assert canonical.loads(raw) == {
        "generation": "b" * 64,
        "label": "step-2",
        "schema": pointer.SCHEMA,
        "sequence": 2,
    }
    assert raw == NEW.encode()


def test_write_leaves_only_the_pointer_in_its_directory(tmp_path: Path) -> None:
    path = tmp_path / "pointer.json"
    pointer.write(path, OLD)
    pointer.write(path, NEW)
    assert os.listdir(tmp_path) == ["pointer.json"]


def test_read_of_a_missing_file_is_none(tmp_path: Path) -> None:
    assert pointer.read(tmp_path / "pointer.json") is None


def test_read_of_a_corrupt_file_raises(tmp_path: Path) -> None:
    path = tmp_path / "pointer.json"
    path.write_bytes(OLD.encode()[:-5])
    with pytest.raises(PointerError, match=r"^pointer: not JSON"):
        pointer.read(path)


def good_record() -> dict[str, Any]:
    return cast(dict[str, Any], canonical.loads(OLD.encode()))


MALFORMED: list[tuple[str, Callable[[dict[str, Any]], None]]] = [
    ("wrong schema", lambda r: r.update(schema="dcp-invariant/pointer/0")),
    ("extra key", lambda r: r.update(previous="c" * 64)),
    ("missing key", lambda r: r.pop("sequence")),
    ("uppercase hex", lambda r: r.update(generation="A" * 64)),
    ("short hex", lambda r: r.update(generation="a" * 63)),
    ("long hex", lambda r: r.update(generation="a" * 65)),
    ("non-hex", lambda r: r.update(generation="z" * 64)),
    ("path as generation", lambda r: r.update(generation="../" + "a" * 61)),
    ("zero sequence", lambda r: r.update(sequence=0)),
    ("negative sequence", lambda r: r.update(sequence=-1)),
    ("true sequence", lambda r: r.update(sequence=True)),
    ("false sequence", lambda r: r.update(sequence=False)),
    ("string sequence", lambda r: r.update(sequence="1")),
    ("label not a string", lambda r: r.update(label=None)),
]


def test_the_malformed_table_starts_from_a_valid_record() -> None:
    assert Pointer.decode(canonical.dumps(good_record())) == OLD


@pytest.mark.parametrize("mutate", [m[1] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_decode_rejects_malformed_records(mutate: Callable[[dict[str, Any]], None]) -> None:
    record = good_record()
    mutate(record)
    with pytest.raises(PointerError, match=r"^pointer: "):
        Pointer.decode(canonical.dumps(record))


@pytest.mark.parametrize(
    "raw",
    [OLD.encode() + b"\n", OLD.encode().replace(b",", b", "), b"[]\n", b"1\n"],
    ids=["two-lfs", "spaced", "list", "number"],
)
def test_decode_rejects_other_byte_forms(raw: bytes) -> None:
    with pytest.raises(PointerError, match=r"^pointer: "):
        Pointer.decode(raw)


def failing_replace(*args: object, **kwargs: object) -> None:
    raise OSError("simulated failure of os.replace")


def test_a_failed_replace_keeps_the_old_pointer_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "pointer.json"
    pointer.write(path, OLD)
    before = path.read_bytes()
    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="simulated"):
        pointer.write(path, NEW)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["pointer.json"]


def test_a_failed_first_write_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError, match="simulated"):
        pointer.write(tmp_path / "pointer.json", OLD)
    assert os.listdir(tmp_path) == []
