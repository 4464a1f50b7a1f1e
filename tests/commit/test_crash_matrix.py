"""Every filesystem operation of seal and promote, interrupted: before it, after it, or by EIO.

After each interruption the pointer is either unchanged (and the previous generation still
verifies) or names the new, complete, verifying generation; then a retry completes, publishes
exactly once (sequence = parent + 1) and leaves no temporary, seal or candidate behind. The
operation lists are what a clean seal and promote perform, traced, so a new operation without a
crash point here fails ``test_the_traced_operations_are_the_matrix``.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from commit_helpers import (
    NESTED_DIRECTORIES,
    NESTED_FILES,
    SHARD0,
    SHARD1,
    Crash,
    Injector,
    Mode,
    commit,
    temporaries,
    write_candidate,
    write_nested_candidate,
)

from dcp_invariant.commit import CheckpointStore, CommitError, Generation
from dcp_invariant.commit.lineage import Lineage

# The page that shows the matrix (the README points to it).
COMMIT_PROTOCOL = Path(__file__).resolve().parents[2] / "docs" / "commit-protocol.md"
LABEL = "step-2"


def written(directory: str, name: str) -> list[tuple[str, str]]:
    """What durable.replace_file does: temporary, data, flush, rename over, flush the directory."""
    prefix = "" if directory == "." else f"{directory}/"
    temporary = f"{prefix}.{name}.<random>.tmp"
    return [
        ("open for write", temporary),
        ("write", temporary),
        ("fsync", temporary),
        ("replace", f"{prefix}{name}"),
        ("fsync", directory),
    ]


FIRST_ONLY = "create generations/ (first promotion only)"
Steps = dict[str, list[tuple[str, list[tuple[str, str]]]]]


def traced(files: tuple[str, ...], directories: tuple[str, ...]) -> Steps:
    """The operations of a clean seal and promote of a candidate holding ``files`` and
    ``directories`` (relative, sorted): every subdirectory is flushed before the candidate's own
    entries and made read-only before it, deepest first."""
    deepest_first = tuple(reversed(directories))
    return {
        "seal": [
            (
                "flush the candidate's files",
                [("fsync", f"candidates/<label>/{n}") for n in files]
                + [("fsync", f"candidates/<label>/{d}") for d in deepest_first]
                + [("fsync", "candidates/<label>")],
            ),
            ("take the store lock", [("open for write", "store.lock")]),
            ("write its lineage", written("candidates", "<label>.lineage.json")),
            ("write its receipt", written("candidates", "<label>.receipt.json")),
        ],
        "promote": [
            ("take the store lock", [("open for write", "store.lock")]),
            (FIRST_ONLY, [("mkdir", "generations"), ("fsync", ".")]),
            ("write the generation's receipt", written("generations", "<generation>.receipt.json")),
            ("write the generation's lineage", written("generations", "<generation>.lineage.json")),
            (
                "move the candidate into generations/",
                [
                    ("rename", "generations/<generation>"),
                    ("fsync", "generations"),
                    ("fsync", "candidates"),
                ],
            ),
            (
                "make it read-only",
                [("chmod", f"generations/<generation>/{n}") for n in files]
                + [("chmod", f"generations/<generation>/{d}") for d in deepest_first]
                + [("chmod", "generations/<generation>")],
            ),
            ("write pointer.json", written(".", "pointer.json")),
            (
                "remove the seal",
                [
                    ("unlink", "candidates/<label>.lineage.json"),
                    ("unlink", "candidates/<label>.receipt.json"),
                    ("fsync", "candidates"),
                ],
            ),
        ],
    }


# "flat": a DCP save (.metadata and a shard per rank); "nested": an app's own save, sealed
# without a marker, with files in subdirectories and an empty directory.
SHAPES: dict[str, Steps] = {
    "flat": traced((".metadata", SHARD0, SHARD1), ()),
    "nested": traced(NESTED_FILES, NESTED_DIRECTORIES),
}
STEPS = SHAPES["flat"]
# The directories a promotion makes read-only, which Windows gives no write bits.
_DIRECTORIES = {"generations/<generation>"} | {
    f"generations/<generation>/{d}" for d in NESTED_DIRECTORIES
}


MODES: tuple[Mode, ...] = ("before", "after", "eio")
# "first": promoting into an empty store; "next": on top of one generation (a parent to keep).
STARTS = ("first", "next")


def on_this_platform(op: tuple[str, str]) -> bool:
    """Windows skips two kinds: durable.fsync returns at once there (NTFS journals what a rename
    needs; only a temporary's own os.fsync remains), and directories get no write bits."""
    kind, path = op
    if sys.platform != "win32":
        return True
    return not (kind == "fsync" and not path.endswith(".tmp")) and not (
        kind == "chmod" and path in _DIRECTORIES
    )


def steps(phase: str, start: str, shape: str = "flat") -> list[tuple[str, tuple[str, str]]]:
    """Each operation of a clean ``phase``, with the protocol step it belongs to."""
    return [
        (step, op)
        for step, ops in SHAPES[shape][phase]
        if start == "first" or step != FIRST_ONLY
        for op in ops
        if on_this_platform(op)
    ]


def operations(phase: str, start: str, shape: str = "flat") -> list[tuple[str, str]]:
    return [op for _, op in steps(phase, start, shape)]


POINTS = [
    (phase, start, index, mode)
    for start in STARTS
    for phase in ("seal", "promote")
    for index in range(len(operations(phase, start)))
    for mode in MODES
]
# A nested save on top of a generation: what nesting adds is the same in an empty store.
NESTED_POINTS = [
    (phase, "next", index, mode)
    for phase in ("seal", "promote")
    for index in range(len(operations(phase, "next", "nested")))
    for mode in MODES
]


def point_id(point: tuple[str, str, int, str], shape: str = "flat") -> str:
    phase, start, index, mode = point
    kind, _ = operations(phase, start, shape)[index]
    return f"{start}-{phase}-{index:02d}-{kind.replace(' ', '_')}-{mode}"


@dataclass(frozen=True)
class Outcome:
    pointer: str  # "old": unchanged; "new": names the new generation
    leftovers: bool  # temporaries or a half-written seal the retry had to clean up


def normalise(ops: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(kind, path.replace(LABEL, "<label>")) for kind, path in ops]


def setup(
    root: Path, start: str, save: Any = None, shape: str = "flat"
) -> tuple[CheckpointStore, Generation | None]:
    store = CheckpointStore(root, marker=None if shape == "nested" else ".metadata")
    previous = commit(store, "step-1") if start == "next" else None
    if save is not None:
        save(store.candidate(LABEL))
    elif shape == "nested":
        write_nested_candidate(store, LABEL)
    else:
        write_candidate(store, LABEL)
    return store, previous


def interrupt(
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
    phase: str,
    start: str,
    index: int,
    mode: Mode,
    save: Any = None,
    shape: str = "flat",
) -> Outcome:
    """Run seal then promote with the operation interrupted; check the invariant; retry."""
    store, previous = setup(root, start, save, shape)
    before = store.pointer_bytes()
    if phase == "promote":
        store.seal(LABEL)
    injector = Injector(store.root, at=index, mode=mode)
    with injector.patched(monkeypatch), pytest.raises((Crash, OSError, CommitError)) as info:
        if phase == "seal":
            store.seal(LABEL)
        store.promote(LABEL)
    assert injector.fired, f"operation {index} was never reached: {injector.ops}"
    if mode == "eio":
        assert not isinstance(info.value, Crash)

    # The invariant, right after the interruption.
    after = store.pointer_bytes()
    if after == before:
        pointer = "old"
        if previous is not None:
            assert store.resolve() == previous
    else:
        pointer = "new"
        # resolve() verifies the whole tree: every file and directory, the empty one too.
        published = store.resolve()
        assert published.receipt.label == LABEL
    leftovers = bool(temporaries(store.root)) or _orphan_lineage(store)

    # The retry, as a caller that does not know where it stopped would do it.
    if not (store.candidates / f"{LABEL}.receipt.json").exists() and pointer == "old":
        store.seal(LABEL)
    generation = store.promote(LABEL)
    assert store.resolve() == generation
    current = store.read_pointer()
    assert current is not None
    assert current.sequence == (1 if previous is None else 2)
    line = Lineage.decode((store.generations / f"{generation.digest}.lineage.json").read_bytes())
    assert line.parent_digest == (None if previous is None else _digest(before))
    assert temporaries(store.root) == []
    assert sorted(p.name for p in store.candidates.iterdir()) == []
    expected = [generation.digest] if previous is None else [previous.digest, generation.digest]
    assert store.generation_names() == sorted(expected)
    if shape == "nested":
        assert generation.receipt.directories == NESTED_DIRECTORIES
        assert (generation.path / "empty").is_dir()
    return Outcome(pointer, leftovers)


def _orphan_lineage(store: CheckpointStore) -> bool:
    return (store.candidates / f"{LABEL}.lineage.json").exists() and not (
        store.candidates / f"{LABEL}.receipt.json"
    ).exists()


def _digest(raw: bytes | None) -> str | None:
    return None if raw is None else hashlib.sha256(raw).hexdigest()


MEASURED: dict[tuple[str, str, int, str], Outcome] = {}


@pytest.fixture(autouse=True)
def no_flush_to_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync stays an operation that can be interrupted, but does not wait for the disk.

    An in-process crash keeps the page cache, so flushing cannot change any outcome here; it
    would only make each of the hundreds of points take a few hundred milliseconds.
    """
    monkeypatch.setattr(os, "fsync", lambda fd: None)


@pytest.mark.parametrize("start", STARTS)
def test_the_traced_operations_are_the_matrix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, start: str
) -> None:
    store, _ = setup(tmp_path / "store", start)
    injector = Injector(store.root)
    with injector.patched(monkeypatch):
        store.seal(LABEL)
    assert normalise(injector.ops) == operations("seal", start)
    injector = Injector(store.root)
    with injector.patched(monkeypatch):
        store.promote(LABEL)
    assert normalise(injector.ops) == operations("promote", start)


@pytest.mark.parametrize("point", POINTS, ids=[point_id(p) for p in POINTS])
def test_an_interrupted_operation_keeps_the_invariant_and_a_retry_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: tuple[str, str, int, Mode]
) -> None:
    phase, start, index, mode = point
    MEASURED[point] = interrupt(tmp_path / "store", monkeypatch, phase, start, index, mode)


def test_the_traced_operations_of_a_nested_save_are_the_matrix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every subdirectory is flushed at seal, before the rename can publish it, and made
    read-only at promotion."""
    store, _ = setup(tmp_path / "store", "next", shape="nested")
    injector = Injector(store.root)
    with injector.patched(monkeypatch):
        store.seal(LABEL)
    assert normalise(injector.ops) == operations("seal", "next", "nested")
    injector = Injector(store.root)
    with injector.patched(monkeypatch):
        store.promote(LABEL)
    assert normalise(injector.ops) == operations("promote", "next", "nested")


NESTED_MEASURED: dict[tuple[str, str, int, str], Outcome] = {}


@pytest.mark.parametrize("point", NESTED_POINTS, ids=[point_id(p, "nested") for p in NESTED_POINTS])
def test_an_interrupted_nested_promotion_keeps_the_invariant_and_a_retry_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, point: tuple[str, str, int, Mode]
) -> None:
    phase, start, index, mode = point
    NESTED_MEASURED[point] = interrupt(
        tmp_path / "store", monkeypatch, phase, start, index, mode, shape="nested"
    )


# --- a real torch.distributed.checkpoint save at three of the points ---------------------------

DCP_POINTS = [
    ("seal", ("replace", "candidates/<label>.receipt.json"), "eio"),
    ("promote", ("rename", "generations/<generation>"), "after"),
    ("promote", ("replace", "pointer.json"), "after"),
]


# DCP warns that it runs without a process group, which is the point here.
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.torch
@pytest.mark.parametrize(
    ("phase", "operation", "mode"),
    DCP_POINTS,
    ids=[f"{p}-{op[0]}-{op[1].split('/')[0]}-{m}" for p, op, m in DCP_POINTS],
)
def test_a_real_dcp_save_interrupted_at_a_crash_point(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    phase: str,
    operation: tuple[str, str],
    mode: Mode,
) -> None:
    torch = pytest.importorskip("torch")
    import torch.distributed.checkpoint as dcp

    saved = {"t": torch.arange(4.0), "step": torch.tensor(2)}

    def save(directory: Path) -> None:
        # No process group: no_dist saves as a single process (torch 2.13's dcp.save signature).
        dcp.save(dict(saved), checkpoint_id=str(directory), no_dist=True)

    # Where the operation falls in a DCP candidate's trace (its file count differs).
    trace_store, _ = setup(tmp_path / "trace", "next", save)
    injector = Injector(trace_store.root)
    with injector.patched(monkeypatch):
        if phase == "seal":
            trace_store.seal(LABEL)
        else:
            trace_store.seal(LABEL)
            injector.ops.clear()
            trace_store.promote(LABEL)
    index = normalise(injector.ops).index(operation)

    outcome = interrupt(tmp_path / "store", monkeypatch, phase, "next", index, mode, save)
    assert outcome.pointer == ("new" if operation[1] == "pointer.json" else "old")
    loaded = {"t": torch.zeros(4), "step": torch.tensor(0)}
    store = CheckpointStore(tmp_path / "store")
    generation = store.resolve()
    dcp.load(loaded, checkpoint_id=str(generation.path), no_dist=True)
    store.verify(generation)
    assert torch.equal(loaded["t"], saved["t"]) and int(loaded["step"]) == 2


# --- the matrix docs/commit-protocol.md shows -----------------------------------------------


def render(measured: dict[tuple[str, str, int, str], Outcome], shape: str = "flat") -> str:
    """Protocol steps by interruption: where the pointer was after it, and what was cleaned."""
    cells: dict[tuple[str, str], dict[str, list[Outcome]]] = {}
    for (phase, start, index, mode), outcome in measured.items():
        step, _ = steps(phase, start, shape)[index]
        cells.setdefault((phase, step), {m: [] for m in MODES})[mode].append(outcome)
    lines = [
        "| step | operations | crash before | crash after | I/O error (EIO) |",
        "|---|---|---|---|---|",
    ]
    for (phase, step), by_mode in cells.items():
        points = len(by_mode["before"])
        shown = " | ".join(_cell(by_mode[m]) for m in MODES)
        lines.append(f"| {phase}: {step} | {points} | {shown} |")
    total = {m: [o for c in cells.values() for o in c[m]] for m in MODES}
    shown = " | ".join(_cell(total[m]) for m in MODES)
    lines.append(f"| all | {len(total['before'])} | {shown} |")
    return "\n".join(lines)


def _cell(outcomes: list[Outcome]) -> str:
    counts = Counter(o.pointer for o in outcomes)
    text = ", ".join(f"{counts[p]} {p}" for p in ("old", "new") if counts[p])
    cleaned = sum(o.leftovers for o in outcomes)
    return f"{text}; {cleaned} cleaned" if cleaned else text


@pytest.mark.skipif(sys.platform == "win32", reason="measured where every operation exists")
def test_the_docs_matrix_is_what_the_crash_test_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n, point in enumerate(POINTS):
        if point not in MEASURED:
            MEASURED[point] = interrupt(tmp_path / f"s{n}", monkeypatch, *point)
    table = render({p: MEASURED[p] for p in POINTS})
    print(table)
    assert table in COMMIT_PROTOCOL.read_text(encoding="utf-8"), (
        "replace the crash matrix in docs/commit-protocol.md with the table printed above"
    )


@pytest.mark.skipif(sys.platform == "win32", reason="measured where every operation exists")
def test_the_docs_nested_matrix_is_what_the_crash_test_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n, point in enumerate(NESTED_POINTS):
        if point not in NESTED_MEASURED:
            NESTED_MEASURED[point] = interrupt(
                tmp_path / f"s{n}", monkeypatch, *point, shape="nested"
            )
    table = render({p: NESTED_MEASURED[p] for p in NESTED_POINTS}, "nested")
    print(table)
    assert table in COMMIT_PROTOCOL.read_text(encoding="utf-8"), (
        "replace the nested crash matrix in docs/commit-protocol.md with the table printed above"
    )
