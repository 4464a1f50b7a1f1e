"""The interpreter's templates (unpickler._Templates) read what its opcodes read: the same values,
the same records, the same refusals and errors, the same work counted, on genuine files and on
every seeded mutant of them, and when something asks for a record a template deferred."""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Iterator
from typing import Final
from unittest import mock

import pytest
from genuine_pickler import dumps
from inspect_data import WORLD_SIZES, metadata_bytes, mutants
from unpickled_graph import graph

from dcp_invariant.inspection import metadata, records, unpickler
from dcp_invariant.inspection.budget import Budget
from dcp_invariant.inspection.errors import MetadataProblem
from dcp_invariant.inspection.unpickler import Instance, PickledDict

# Genuine files: the checked-in saves of torch, and pickle.dump's own output of torch's objects
# (genuine_pickler): runs of chunks and entries long and short, LONG_BINGET references, LONG1
# offsets, 0 to 4 dimensions, empty chunks, byte items, and FRAMEs that fall inside records.
_GENERATED = {
    "1 rank": dumps(1),
    "3 ranks": dumps(3),
    "4 ranks, 2 layers": dumps(4, 2),
    "8 ranks, 3 layers": dumps(8, 3),
    "64 ranks, 4 layers": dumps(64, 4),
}


def _genuine() -> Iterator[tuple[str, bytes]]:
    for world_size in WORLD_SIZES:
        yield f"torch 2.13.0 at world size {world_size}", metadata_bytes(world_size)
    yield from _GENERATED.items()


def _loaded(data: bytes, *, templates: bool) -> object:
    """What ``unpickler.load`` gives (as a graph, :func:`unpickled_graph.graph`) or raises."""
    try:
        return graph(unpickler.load(data, templates=templates))
    except MetadataProblem as exc:
        return type(exc).__name__, str(exc)


def _parsed(data: bytes, *, templates: bool, units: int | None = None) -> tuple[object, int]:
    """What ``metadata.parse`` gives or raises, and the work it counted."""
    budget = Budget(units)
    load = functools.partial(unpickler.load, templates=templates)
    with mock.patch.object(unpickler, "load", load):
        try:
            found: object = metadata.parse(data, budget)
        except MetadataProblem as exc:
            found = type(exc).__name__, exc.reasons()
    return found, budget.spent


def _read_by_templates(value: object) -> int:
    """How many records of a load's value a template read (and deferred)."""
    count = 0
    seen: set[int] = set()
    todo = [value]
    while todo:
        v = todo.pop()
        if id(v) in seen:
            continue
        seen.add(id(v))
        if isinstance(v, Instance):
            count += v.recipe is not None
            todo.append(v.state)
        elif isinstance(v, PickledDict):
            todo += [item for pair in v.pairs for item in pair]
        elif isinstance(v, (list, tuple)):
            todo += v
    return count


@pytest.mark.parametrize(("name", "data"), list(_genuine()), ids=[n for n, _ in _genuine()])
def test_templates_read_genuine_files_as_the_opcodes_do(name: str, data: bytes) -> None:
    assert _loaded(data, templates=True) == _loaded(data, templates=False)
    made, spent = _parsed(data, templates=True)
    assert isinstance(made, records.Metadata), made
    assert (made, spent) == _parsed(data, templates=False)


@pytest.mark.parametrize(("name", "data"), _GENERATED.items(), ids=list(_GENERATED))
def test_templates_read_most_records_of_a_genuine_file(name: str, data: bytes) -> None:
    made = metadata.parse(data)
    assert made.storage_data is not None
    chunks = sum(
        len(item.chunks)
        for item in made.state_dict_metadata.values()
        if isinstance(item, records.TensorStorageMetadata)
    )
    # A chunk is an Instance, an entry two: all but the first of each list or batch, and one
    # where a FRAME begins, are read by a template.
    by_templates = _read_by_templates(unpickler.load(data))
    assert by_templates >= (chunks + 2 * len(made.storage_data)) // 2
    assert _read_by_templates(unpickler.load(data, templates=False)) == 0


def test_templates_and_opcodes_agree_on_every_mutant() -> None:
    """1,000 seeded mutants of a genuine file: each byte a template matches is one a mutant may
    change, and the opcodes must then have the last word (the same value, refusal or error)."""
    for data in mutants(_GENERATED["4 ranks, 2 layers"], 1000, seed=11):
        assert _loaded(data, templates=True) == _loaded(data, templates=False), data
        assert _parsed(data, templates=True) == _parsed(data, templates=False), data


@pytest.mark.parametrize("short", [1, 2, 3, 7, 50, 400, 2000])
def test_a_budget_that_runs_out_among_template_records_says_where_as_the_opcodes_do(
    short: int,
) -> None:
    data = _GENERATED["8 ranks, 3 layers"]
    _, spent = _parsed(data, templates=False)
    assert spent > short
    found, _ = with_templates = _parsed(data, templates=True, units=spent - short)
    assert with_templates == _parsed(data, templates=False, units=spent - short)
    assert isinstance(found, tuple) and found[0] == "MetadataTooLarge"


# --- asking for what a template deferred -------------------------------------------------------


def _memo(data: bytes) -> list[object]:
    """The memo the opcodes leave (templates off): the entries a template defers."""
    budget = Budget()
    budget.for_bytes(len(data))
    machine = unpickler._Machine(data, budget, templates=False)
    machine.run()
    return machine.memo


def _entry(memo: list[object], want: str, nth: int = -1) -> int:
    """The memo index of the ``nth`` state dict whose first key is ``want``."""
    found = [
        i
        for i, v in enumerate(memo)
        if isinstance(v, PickledDict) and v.pairs and v.pairs[0][0] == want
    ]
    return found[nth]


def _get(index: int) -> bytes:
    return b"j" + struct.pack("<I", index)


def _ending(data: bytes, ops: bytes) -> bytes:
    """``data`` with ``ops`` before its STOP: after the Metadata is built."""
    assert data.endswith(b"b.")
    return data[:-1] + ops + b"."


def _asking(ops: Callable[[int], bytes]) -> Iterator[bytes]:
    """The genuine file with ``ops(index)`` before its STOP, for the memo index of the state
    of a deferred chunk, a deferred key and a deferred value."""
    data = _GENERATED["8 ranks, 3 layers"]
    memo = _memo(data)
    for at in (_entry(memo, "offsets"), _entry(memo, "fqn", nth=-2), _entry(memo, "relative_path")):
        yield _ending(data, ops(at))


_PUT: Final = b"r"  # LONG_BINPUT


@pytest.mark.parametrize(
    "ops",
    [
        # A deferred state, what follows it in the memo, and its Instance: on the stack STOP
        # returns.
        lambda at: b"(" + _get(at) + _get(at + 1) + _get(at - 1) + b"t",
        # A pair added to a deferred state: no longer what the template read.
        lambda at: _get(at) + b"(\x8c\x01xK\x01u0",
        # The memo's first entry overwritten by a PUT, then the deferred state read.
        lambda at: b"(N" + _PUT + struct.pack("<I", 0) + b"0" + _get(at) + b"t",
        # A gap in the memo: from there it is a dict, every deferred record made first.
        lambda at: (
            b"(N" + _PUT + struct.pack("<I", 1 << 30) + b"0" + _get(at) + _get(at + 1) + b"t"
        ),
        # A second BUILD of a deferred record.
        lambda at: _get(at - 1) + b"}b0",
        # A deferred record as a dict key, and as a value.
        lambda at: b"}(" + _get(at - 1) + b"K\x01u0",
        lambda at: b"}(\x8c\x01k" + _get(at - 1) + b"u0",
    ],
)
def test_what_a_template_deferred_is_what_the_opcodes_make_when_asked_for(
    ops: Callable[[int], bytes],
) -> None:
    for data in _asking(ops):
        assert _loaded(data, templates=True) == _loaded(data, templates=False)
        assert _parsed(data, templates=True) == _parsed(data, templates=False)


def test_a_put_over_a_deferred_entry_makes_its_record_first() -> None:
    data = _GENERATED["8 ranks, 3 layers"]
    memo = _memo(data)
    at = _entry(memo, "offsets")
    # Overwrite a deferred chunk's state in the memo, then read it and the entry after it (the
    # chunk's offsets), which the PUT left as the opcodes made it.
    ops = b"(N" + _PUT + struct.pack("<I", at) + b"0" + _get(at) + _get(at + 1) + b"t"
    mutated = _ending(data, ops)
    loaded = _loaded(mutated, templates=True)
    assert loaded == _loaded(mutated, templates=False)
    assert loaded == graph((None, memo[at + 1]))


# --- storage_data as rows -------------------------------------------------------------------


def test_storage_data_is_the_dict_pickle_load_builds() -> None:
    rows: list[records.StorageRow] = [
        ("w", (0, 0), 0, "a", 0, 8, None),
        ("step", None, None, "a", 8, 4, None),
        ("w", (0, 0), 5, "b", 16, 8, ("zstd",)),  # the same key: its place, its first hint
    ]
    data = records.StorageData(rows)
    expected = {
        records.MetadataIndex("w", (0, 0), 0): records.StorageInfo("b", 16, 8, ("zstd",)),
        records.MetadataIndex("step"): records.StorageInfo("a", 8, 4),
    }
    assert data == expected and len(data) == 2
    assert [key.index for key in data] == [0, None]
    assert data[records.MetadataIndex("w", (0, 0), 9)] == records.StorageInfo("b", 16, 8, ("zstd",))
    assert records.MetadataIndex("step") in data
    assert records.MetadataIndex("w", (0, 1)) not in data
    with pytest.raises(KeyError):
        data[records.MetadataIndex("w", (0, 1))]
    assert records.StorageData.of(expected) == data
    assert records.StorageData.of(data) is data
    assert data.paths() == ["b", "a"] and data.lengths() == [8, 4] and data.fqns() == ["w", "step"]
    assert set(data.keys_present()) == {("w", (0, 0)), ("step", None)}
