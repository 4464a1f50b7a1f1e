"""The comparison of evidence recorded on other machines (tests/cross_machine.py): equal where
only float arithmetic's last bits moved, unequal where anything the code decides did."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cross_machine import comparable, differing_files, is_float_kind

from dcp_invariant import canonical
from dcp_invariant.evidence import schema

DATA = Path(__file__).parent / "data"
DIGEST_A, DIGEST_B, DIGEST_C = "a" * 64, "b" * 64, "c" * 64


def walk(**entries: str) -> dict[str, Any]:
    return {"ranks": [{"objects": {"saved": dict(sorted(entries.items()))}}]}


def test_a_record_from_another_cpu_compares_equal_and_differs_in_its_bits() -> None:
    """tests/data/other-cpu/resume_2.json is the example's resume_2 as this repository's runner
    wrote it with ``ATEN_CPU_CAPABILITY=default`` (torch's scalar kernels): its float bits, and
    so the labels its float tensors got, are not those of tests/data/fixture-artifact."""
    name = schema.observation_file("resume_2")
    there = canonical.loads((DATA / "other-cpu" / "resume_2.json").read_bytes())
    here = canonical.loads((DATA / "fixture-artifact" / name).read_bytes())
    assert there != here
    assert comparable(there) == comparable(here)


def test_float_tensors_that_share_a_label_on_one_machine_only_compare_equal() -> None:
    # As issue #45 saw: a bias bit-equal to an earlier tensor on one machine (~2), a new value
    # on the other (~3), and every later label shifted by one, exact ones included.
    one = walk(a="float64[32] ~1", b="float64[32] ~1", c="int64[2] ~2", g="Generator ~3")
    other = walk(a="float64[32] ~1", b="float64[32] ~2", c="int64[2] ~3", g="Generator ~4")
    assert comparable(one) == comparable(other)


def test_exact_values_that_are_equal_on_one_side_only_compare_unequal() -> None:
    one = walk(c="int64[2] ~1", d="int64[2] ~1")
    other = walk(c="int64[2] ~1", d="int64[2] ~2")
    assert comparable(one) != comparable(other)


@pytest.mark.parametrize(
    ("mine", "theirs"),
    [
        ("float64[32] ~1", "float64[31] ~1"),  # a shape
        ("float64[32] ~1", "float32[32] ~1"),  # a dtype
        (f"int64[2] {DIGEST_A}", f"int64[2] {DIGEST_B}"),  # an exact tensor's bytes
        ("int 3", "int 4"),  # a counter
        ("Generator ~1", "ByteTensor ~1"),  # a kind
        ("float 0x1.0p-1", "int 1"),  # a kind again
        ("volatile", "float 0x1.0p-1"),
    ],
)
def test_what_the_code_decides_still_compares_unequal(mine: str, theirs: str) -> None:
    assert comparable(walk(x=mine)) != comparable(walk(x=theirs))


@pytest.mark.parametrize(
    ("mine", "theirs"),
    [
        ("0x1.8000000000000p-1", "0x1.8000000000001p-1"),  # a loss
        ("float 0x1.999999999999ap-5", "float 0x1.999999999999bp-5"),  # a float attribute
        (f"float64[4] {DIGEST_A}", f"float64[4] {DIGEST_B}"),
        (f"bfloat16[4] {DIGEST_A}", f"bfloat16[4] {DIGEST_B}"),
        (f"ndarray float32[3] {DIGEST_A}", f"ndarray float32[3] {DIGEST_B}"),
        (f"float {DIGEST_A}", f"float {DIGEST_B}"),  # a state dict's Python float
        (DIGEST_A, DIGEST_B),  # a receipt's digest over checkpoint bytes
    ],
)
def test_what_float_arithmetic_decides_compares_equal(mine: str, theirs: str) -> None:
    assert comparable(walk(x=mine)) == comparable(walk(x=theirs))


@pytest.mark.parametrize(
    ("kind", "made_by_floats"),
    [
        ("float64[32]", True),
        ("float", True),
        ("bfloat16[2,2]", True),
        ("complex64[1]", True),
        ("float8_e4m3fn[8]", True),
        ("qint8[4]", True),
        ("ndarray float64[3]", True),
        ("int64[2]", False),
        ("uint8[16]", False),
        ("bool[3]", False),
        ("Generator", False),
        ("ByteTensor", False),
        ("state", False),
        ("str", False),
    ],
)
def test_kinds_made_by_float_arithmetic(kind: str, made_by_floats: bool) -> None:
    assert is_float_kind(kind) is made_by_floats


def test_exact_digests_and_text_are_kept_as_they_are() -> None:
    record = walk(a=f"int64[2] {DIGEST_C}", b="str", c="True", d="int 7")
    assert comparable(record) == record


def test_artifact_files_differ_only_where_the_code_decided_otherwise(tmp_path: Path) -> None:
    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    for root, loss, verdict in ((mine, "0x1.8p-1", b"pass\n"), (theirs, "0x1.9p-1", b"fail\n")):
        root.mkdir()
        (root / "obs.json").write_bytes(canonical.dumps(walk(x=loss)))
        (root / "same.json").write_bytes(canonical.dumps(walk(x="int 3")))
        (root / "result.txt").write_bytes(verdict)
    files = ["obs.json", "same.json", "result.txt"]
    observations = {"obs.json", "same.json"}
    assert differing_files(mine, theirs, files, observations) == ["result.txt"]
    assert differing_files(mine, theirs, ["obs.json"], set()) == ["obs.json"]  # bytes, unmasked
