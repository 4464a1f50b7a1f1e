"""The pickle interpreter: hostile files are refused by name and never run; plain data reads
exactly as ``pickle.loads`` reads it."""

from __future__ import annotations

import os
import pickle
import pickletools
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from inspect_data import metadata_bytes, mutants
from unpickled_graph import graph

from dcp_invariant.inspection import unpickler
from dcp_invariant.inspection.budget import Budget
from dcp_invariant.inspection.errors import MalformedMetadata, MetadataTooLarge, RefusedPickle
from dcp_invariant.inspection.unpickler import PickledDict

PROTOCOLS = range(pickle.HIGHEST_PROTOCOL + 1)


class _Reduce:
    """A payload whose unpickling calls ``func(*args)``: the classic ``__reduce__`` attack."""

    def __init__(self, func: Callable[..., object], *args: object) -> None:
        self.func = func
        self.args = args

    def __reduce__(self) -> tuple[Callable[..., object], tuple[object, ...]]:
        return self.func, self.args


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[Path]:
    """A file the payloads would create if anything ran them."""
    path = tmp_path / "ran"
    yield path
    assert not path.exists(), "a payload ran"


def _refusal(data: bytes) -> str:
    with pytest.raises(RefusedPickle) as caught:
        unpickler.load(data)
    return str(caught.value)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_os_system_by_reduce_is_refused_naming_it(protocol: int, sentinel: Path) -> None:
    data = pickle.dumps(_Reduce(os.system, f"touch {sentinel}"), protocol=protocol)
    # os.system is posix.system (nt.system on Windows): the pickle names where it lives.
    assert _refusal(data) == f"global {os.system.__module__}.system"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_builtins_eval_is_refused_under_its_python_3_name(protocol: int, sentinel: Path) -> None:
    data = pickle.dumps(_Reduce(eval, f"open({str(sentinel)!r}, 'w')"), protocol=protocol)
    if protocol < 3:  # the pickler writes Python 2's __builtin__; loading maps it back
        assert b"__builtin__" in data
    assert _refusal(data) == "global builtins.eval"


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_subprocess_popen_is_refused(protocol: int, sentinel: Path) -> None:
    data = pickle.dumps(_Reduce(subprocess.Popen, ["touch", str(sentinel)]), protocol=protocol)
    assert _refusal(data) == "global subprocess.Popen"


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (b"cos\nsystem\n(S'touch x'\ntR.", "global os.system"),
        (b"cposix\nsystem\n(S'touch x'\ntR.", "global posix.system"),
        (b"\x80\x04\x8c\x02os\x8c\x06system\x93\x8c\x01x\x85R.", "global os.system"),
        (b"\x80\x02cnt\nsystem\nX\x01\x00\x00\x00x\x85R.", "global nt.system"),
        (b"\x80\x02ctorch\nload\nX\x01\x00\x00\x00x\x85R.", "global torch.load"),
        # A dtype's module with another name: only the dtypes themselves are admitted.
        (b"\x80\x02ctorch\n_C\n.", "global torch._C"),
    ],
)
def test_hand_written_globals_are_refused_by_name(data: bytes, named: str) -> None:
    assert _refusal(data) == named


def test_inst_is_refused_naming_its_global() -> None:
    assert _refusal(b"(S'touch x'\nios\nsystem\n.") == (
        "opcode INST (names a class and calls it): global os.system"
    )


def test_obj_is_refused_even_for_an_admitted_class() -> None:
    assert _refusal(b"(ctorch\nSize\n]o.") == "opcode OBJ (calls a class)"
    # With a global that is not admitted, the global is what is refused first.
    assert _refusal(b"(cos\nsystem\nS'x'\no.") == "global os.system"


@pytest.mark.parametrize(
    ("data", "opcode"),
    [
        (b"\x80\x02\x82\x01.", "EXT1"),
        (b"\x80\x02\x83\x01\x00.", "EXT2"),
        (b"\x80\x02\x84\x01\x00\x00\x00.", "EXT4"),
        (b"Pfoo\n.", "PERSID"),
        (b"\x80\x02X\x01\x00\x00\x00aQ.", "BINPERSID"),
        (b"\x80\x05\x97.", "NEXT_BUFFER"),
        (b"\x80\x05\x98.", "READONLY_BUFFER"),
        (b"\x80\x04\x8f.", "EMPTY_SET"),
        (b"\x80\x05\x96\x00\x00\x00\x00\x00\x00\x00\x00.", "BYTEARRAY8"),
    ],
)
def test_opcodes_that_reach_code_or_hash_values_are_refused(data: bytes, opcode: str) -> None:
    assert _refusal(data).startswith(f"opcode {opcode} (")


@pytest.mark.parametrize(
    ("data", "refused"),
    [
        (b"\x80\x02ctorch\nfloat32\n)R.", "REDUCE of torch.float32"),
        (b"\x80\x02ctorch\nSize\n)\x81.", "NEWOBJ of torch.Size"),
        (b"\x80\x02]}b.", "BUILD of a list"),
        (b"\x80\x02)}(K\x01K\x02ub.", "BUILD of a tuple"),
        (b"\x80\x02X\x01\x00\x00\x00a)R.", "REDUCE of a str"),
        (
            b"\x80\x02ctorch.distributed.checkpoint.metadata\nMetadata\n)R.",
            "REDUCE of torch.distributed.checkpoint.metadata.Metadata (DCP builds it with "
            "NEWOBJ, never calls it)",
        ),
    ],
)
def test_calls_on_anything_but_an_admitted_stand_in_are_refused(data: bytes, refused: str) -> None:
    assert _refusal(data) == refused


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_nested_pickle_loader_is_refused(protocol: int, sentinel: Path) -> None:
    inner = pickle.dumps(_Reduce(os.system, f"touch {sentinel}"))
    data = pickle.dumps(_Reduce(pickle.loads, inner), protocol=protocol)
    # pickle.loads lives in _pickle; below protocol 3 the pickler writes it as pickle.loads.
    assert _refusal(data) == ("global pickle.loads" if protocol < 3 else "global _pickle.loads")


def test_a_nested_pickle_held_as_bytes_is_data_and_never_runs(sentinel: Path) -> None:
    inner = pickle.dumps(_Reduce(os.system, f"touch {sentinel}"))
    loaded = unpickler.load(pickle.dumps({"payload": inner}, protocol=4))
    assert isinstance(loaded, PickledDict) and loaded.pairs == [("payload", inner)]


@pytest.mark.parametrize(
    "data",
    [
        b"\x80\x04\x8d" + (2**31).to_bytes(8, "little") + b"x.",  # BINUNICODE8
        b"\x80\x04\x8e" + (2**31).to_bytes(8, "little") + b"x.",  # BINBYTES8
        b"\x80\x04\x8e" + (2**64 - 1).to_bytes(8, "little") + b"x.",
        b"\x80\x03X" + (2**31).to_bytes(4, "little") + b"x.",  # BINUNICODE
        b"\x80\x03B" + (2**32 - 1).to_bytes(4, "little") + b"x.",  # BINBYTES
        b"\x80\x02T" + (2**31 - 1).to_bytes(4, "little") + b"x.",  # BINSTRING
        b"\x80\x02\x8b" + (2**31 - 1).to_bytes(4, "little") + b"x.",  # LONG4
        b"\x80\x04\x95" + (2**31).to_bytes(8, "little") + b"N.",  # FRAME
    ],
)
def test_a_2_gib_length_prefix_is_refused_without_allocating_it(data: bytes) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(MalformedMetadata, match="truncated"):
            unpickler.load(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_every_truncation_of_a_real_metadata_is_malformed_not_a_crash() -> None:
    data = metadata_bytes(2)
    cuts = {*range(0, len(data), 37), *range(len(data) - 40, len(data))}
    for cut in sorted(cuts):
        with pytest.raises(MalformedMetadata):
            unpickler.load(data[:cut])


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"", "before its STOP opcode"),
        (b"\x80\x06N.", "unsupported pickle protocol 6"),
        (b"\xff.", "unknown opcode 0xff"),
        (b"a.", "stack underflow"),
        (b"(.", "stack underflow"),  # STOP pops above the last MARK, as Lib/pickle.py does
        (b"\x80\x02h\x05.", "memo entry 5 read before it was set"),
        (b"\x80\x02}K\x01s.", "stack underflow"),
        (b"\x80\x02}(K\x01u.", "odd number of items"),
        (b"\x80\x02K\x01K\x02a.", "APPEND to an int"),
        (b"I" + b"9" * 100 + b"\n.", "a text number of 100 characters"),
        (b"\x80\x02}]K\x01s.", "a dict key that is a list"),
        (b"\x80\x02ctorch\nSize\nX\x01\x00\x00\x00a\x85\x85R.", "torch.Size: expected"),
        (b"\x80\x02ctorch.serialization\n_get_layout\nX\x01\x00\x00\x00a\x85R.", "layout"),
    ],
)
def test_malformed_streams_are_named(data: bytes, says: str) -> None:
    with pytest.raises(MalformedMetadata) as caught:
        unpickler.load(data)
    assert says in str(caught.value)


def test_a_text_integer_is_bounded_whatever_the_int_string_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # no limit: CPython would convert any length, quadratically
    try:
        with pytest.raises(MalformedMetadata, match="text number"):
            unpickler.load(b"L" + b"7" * 100_000 + b"L\n.")
    finally:
        sys.set_int_max_str_digits(limit)


def test_deep_nesting_is_read_without_recursion() -> None:
    depth = 200_000
    data = b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b"."
    value = unpickler.load(data)
    for _ in range(depth - 1):
        assert isinstance(value, list) and len(value) == 1
        value = value[0]
    assert value == []


def test_a_nested_tuple_key_is_refused_unhashed() -> None:
    depth = 100_000
    data = b"\x80\x04}" + b")" + b"\x85" * depth + b"Ns."
    with pytest.raises(MalformedMetadata, match="a dict key that is a tuple"):
        unpickler.load(data)


def test_memo_references_share_one_object_as_pickle_does() -> None:
    inner = [1]
    shared = unpickler.load(pickle.dumps([inner, inner], protocol=2))
    assert isinstance(shared, list) and shared[0] is shared[1]
    cyclic: list[object] = []
    cyclic.append(cyclic)
    loaded = unpickler.load(pickle.dumps(cyclic, protocol=4))
    assert isinstance(loaded, list) and loaded[0] is loaded


def test_every_opcode_is_interpreted_or_refused_by_name() -> None:
    names = {op.name for op in pickletools.opcodes}
    handled = set(unpickler._BY_NAME)
    refused = set(unpickler._REFUSED)
    assert handled | refused == names
    assert not handled & refused


# --- plain data reads as pickle.loads reads it -----------------------------------------------

_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**128), max_value=2**128)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)


def _values(scalars: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars,
        lambda inner: (
            st.lists(inner, max_size=4)
            | st.tuples(inner, inner)
            | st.lists(inner, max_size=5).map(tuple)
            | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=20,
    )


def _plain(value: object) -> object:
    if isinstance(value, PickledDict):
        return {k: _plain(v) for k, v in value.pairs}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return value


@settings(max_examples=150, deadline=None, database=None)
@given(_values(_SCALARS), st.sampled_from(PROTOCOLS))
def test_plain_data_reads_as_pickle_loads_reads_it(value: object, protocol: int) -> None:
    data = pickle.dumps(value, protocol=protocol)
    assert _plain(unpickler.load(data)) == pickle.loads(data)


@settings(max_examples=60, deadline=None, database=None)
@given(_values(_SCALARS | st.binary(max_size=10)), st.sampled_from(range(3, 6)))
def test_bytes_read_as_pickle_loads_reads_them_from_protocol_3(
    value: object, protocol: int
) -> None:
    data = pickle.dumps(value, protocol=protocol)
    assert _plain(unpickler.load(data)) == pickle.loads(data)


def test_bytes_below_protocol_3_are_a_call_and_refused() -> None:
    # Python 3 pickles bytes for Python 2 readers as _codecs.encode(text, 'latin1'): a call.
    assert _refusal(pickle.dumps(b"x", protocol=2)) == "global _codecs.encode"


# --- the inline loop against the handlers -----------------------------------------------------


def _outcome(data: bytes, *, inline: bool) -> object:
    """What loading ``data`` gives or raises, through the inline loop or the handlers alone."""
    try:
        if inline:
            return graph(unpickler.load(data))
        budget = Budget()
        budget.for_bytes(len(data))
        machine = unpickler._Machine(data, budget)
        try:
            while machine.result is unpickler.UNSET:
                machine.step()
        except (RefusedPickle, MalformedMetadata, MetadataTooLarge):
            raise
        except (ValueError, OverflowError, UnicodeDecodeError) as exc:
            raise MalformedMetadata(f"invalid pickle near byte {machine.pos}: {exc}") from exc
        return graph(machine.result)
    except (RefusedPickle, MalformedMetadata, MetadataTooLarge) as exc:
        return (type(exc).__name__, str(exc))


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_the_inline_loop_reads_real_files_as_the_handlers_do(world_size: int) -> None:
    data = metadata_bytes(world_size)
    assert _outcome(data, inline=True) == _outcome(data, inline=False)


def test_the_inline_loop_and_the_handlers_agree_on_every_mutant() -> None:
    for data in mutants(metadata_bytes(2), 1000, seed=7):
        assert _outcome(data, inline=True) == _outcome(data, inline=False), data


@settings(max_examples=100, deadline=None, database=None)
@given(_values(_SCALARS | st.binary(max_size=10)), st.sampled_from(range(3, 6)))
def test_the_inline_loop_and_the_handlers_agree_on_plain_data(value: object, protocol: int) -> None:
    data = pickle.dumps(value, protocol=protocol)
    assert _outcome(data, inline=True) == _outcome(data, inline=False)
