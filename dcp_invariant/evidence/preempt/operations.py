"""A job's file operations under its run directory, as the interposer reports them, and the
crash points chosen among them. Pure: no processes, no files.

A crash point is the state just before an operation ran: every earlier operation of every
process done, this one and every later one not. It is a state the job really left on disk: the
tool takes it while the job waits inside that operation and its other processes are stopped.
A *SIGTERM point* is the same operation reached in a launch of its own, where the job is sent
SIGTERM just before it and SIGKILL a grace period later, as Kubernetes and Slurm do: the state
is whatever the job's own handling of the signal left.

Operations are grouped into *saves*: the operations made after the job printed step ``k`` and
before it printed the next step line. A save is *complete* at a crash point once the job has
printed a later step, so training went on after it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

Op = Literal[
    "open",
    "truncate-open",
    "write",
    "close",
    "fsync",
    "truncate",
    "rename",
    "unlink",
    "mkdir",
    "rmdir",
    "symlink",
    "link",
]
OPS: tuple[Op, ...] = get_args(Op)
# How a crash point ends the job: SIGKILL at the operation, or SIGTERM there and SIGKILL after
# the grace period.
How = Literal["kill", "term"]
HOWS: tuple[How, ...] = get_args(How)
Point = tuple[How, str, int]  # how, the process, its operation's number
# Always crash points: each one changes which names exist, which is what a job's discovery
# rule reads after a restart (a rename that publishes a checkpoint, an unlink that rotates one).
NAMING: frozenset[Op] = frozenset({"rename", "unlink", "rmdir", "symlink", "link"})
# An fsync changes nothing a process crash leaves: recorded (for a power-loss model), never a
# crash point of its own.
RECORDED_ONLY: frozenset[Op] = frozenset({"fsync"})


@dataclass(frozen=True)
class Operation:
    """One file operation: which process (``rank``: torchrun's RANK, else ``main``), what, on
    which path (relative to the run directory; ``target`` for a rename), its number among that
    process's operations, and how many step lines the job had printed before it."""

    rank: str
    op: Op
    path: str
    target: str
    index: int
    steps_before: int

    @property
    def name(self) -> str:
        """The crash point before this operation, as a report names it: no time, no PID."""
        what = f"{self.op} {self.path}" + (f" -> {self.target}" if self.target else "")
        return f"rank {self.rank} operation {self.index} ({what}), after step {self.steps_before}"

    def record(self) -> dict[str, object]:
        return {
            "index": self.index,
            "op": self.op,
            "path": self.path,
            "rank": self.rank,
            "steps_before": self.steps_before,
            "target": self.target,
        }


class Numbering:
    """Numbers each process's operations in the order it made them."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def parse(self, line: str, steps_before: int) -> Operation | None:
        """The operation an interposer line reports (``OP\\tRANK\\tPATH\\tTARGET``); None for a
        line that is not one."""
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 4 or parts[0] not in OPS:
            return None
        op, rank, path, target = parts
        index = self._next.get(rank, 0)
        self._next[rank] = index + 1
        return Operation(rank, op, path, target, index, steps_before)  # type: ignore[arg-type]


def key(operation: Operation) -> tuple[str, int]:
    """What names an operation across runs: the process and its operation's number."""
    return (operation.rank, operation.index)


# What finds an operation again in another launch: its process, kind and paths (their shape),
# and how many times that process had made the same operation before. Not its number among all of the
# process's operations: a harmless race (which rank makes a shared parent directory) shifts
# every later number, and each point would be lost.
Identity = tuple[str, Op, str, str, int]


# A temporary file's random name, as Python's tempfile (tmpXXXXXXXX) and Rust's tempfile crate
# (.tmpXXXXXX, what safetensors writes model.safetensors through) make it: another in every
# launch, so it is compared by its shape.
_RANDOM_TEMPORARY = re.compile(r"\.?tmp[A-Za-z0-9_]{6,8}")


def shape(path: str) -> str:
    """``path`` with each randomly named temporary component masked (``.tmp*``)."""
    return "/".join(
        "tmp*" if _RANDOM_TEMPORARY.fullmatch(part) else part for part in path.split("/")
    )


class Occurrences:
    """Each operation's :data:`Identity`, in the order a launch makes them."""

    def __init__(self) -> None:
        self._made: dict[tuple[str, Op, str, str], int] = {}

    def of(self, operation: Operation) -> Identity:
        made = (operation.rank, operation.op, shape(operation.path), shape(operation.target))
        before = self._made.get(made, 0)
        self._made[made] = before + 1
        return (*made, before)


def identities(operations: Iterable[Operation]) -> list[Identity]:
    occurrences = Occurrences()
    return [occurrences.of(o) for o in operations]


def point(how: How, operation: Operation | tuple[str, int]) -> Point:
    rank, index = key(operation) if isinstance(operation, Operation) else operation
    return (how, rank, index)


def described(how: How, operation: Operation, grace: float) -> str:
    """How a report names the crash point: no time, no PID."""
    if how == "kill":
        return f"killed before {operation.name}"
    return f"sent SIGTERM before {operation.name} (SIGKILL {grace:g} s later)"


def terminated(operations: Sequence[Operation], budget: int) -> list[Operation]:
    """The SIGTERM points, deterministically, in the order they occur: where a save after the
    first begins (a signal between two steps) and its middle operation (a signal mid-save),
    ``budget`` of them spread evenly, the last save's always among them. Each costs a launch
    of its own, so the budget is small."""
    candidates = [o for o in operations if o.op not in RECORDED_ONLY]
    grouped = saves(candidates)
    spots: list[Operation] = []
    for first in first_of_each_save(candidates)[1:]:
        ops = grouped[first.steps_before]
        spots += [first] if len(ops) < 3 else [first, ops[len(ops) // 2]]
    if budget <= 0 or not spots:
        return []
    if budget >= len(spots):
        return spots
    stride = (len(spots) - 1) / max(1, budget - 1)
    picked = {round(i * stride) for i in range(budget)} if budget > 1 else {len(spots) - 1}
    return [spots[i] for i in sorted(picked)]


def chosen(operations: Sequence[Operation], budget: int) -> list[Operation]:
    """The crash points to check, deterministically, in the order they occur.

    Always: every operation that changes names (rename, unlink, rmdir, link), and the first
    operation of each save after the first (the state between two saves: every earlier save
    whole, training gone on). Then, within ``budget`` in all, others spread evenly (the
    writes that leave a file cut short, the opens that leave it empty).
    """
    candidates = [o for o in operations if o.op not in RECORDED_ONLY]
    must = {key(o) for o in candidates if o.op in NAMING}
    must |= {key(o) for o in first_of_each_save(candidates)[1:]}
    rest = [o for o in candidates if key(o) not in must]
    room = max(0, budget - len(must))
    if room and rest:
        stride = len(rest) / min(room, len(rest))
        must |= {key(rest[int(i * stride)]) for i in range(min(room, len(rest)))}
    return [o for o in candidates if key(o) in must]


def first_of_each_save(operations: Iterable[Operation]) -> list[Operation]:
    """The first operation after each new step count: where each save begins."""
    firsts: list[Operation] = []
    seen: set[int] = set()
    for operation in operations:
        if operation.steps_before not in seen:
            seen.add(operation.steps_before)
            firsts.append(operation)
    return firsts


def saves(operations: Sequence[Operation]) -> dict[int, list[Operation]]:
    """Each save's operations, by the step printed before it."""
    grouped: dict[int, list[Operation]] = {}
    for operation in operations:
        grouped.setdefault(operation.steps_before, []).append(operation)
    return grouped


def intact_saves(operations: Sequence[Operation], point: Operation) -> list[int]:
    """The saves complete before ``point`` whose files no later operation before it touched:
    on disk as the job left them when it went on training. By step, ascending."""
    position = operations.index(point)
    before = operations[:position]
    intact = []
    for step, ops in saves(before).items():
        if step >= point.steps_before:
            continue  # the save under way at the crash point
        last = before.index(ops[-1])
        written = _final_names(ops)
        later = before[last + 1 :]
        if written and not any(_touches(o, written) for o in later):
            intact.append(step)
    return sorted(intact)


def _final_names(ops: Sequence[Operation]) -> set[str]:
    """The paths a save left: what it created or renamed into place, less what it removed."""
    names: set[str] = set()
    for o in ops:
        if o.op in ("open", "truncate-open", "mkdir", "symlink", "link"):
            names.add(o.path)
        elif o.op == "rename":  # a directory renamed carries what it holds
            moved = {n for n in names if n == o.path or n.startswith(o.path + "/")}
            names -= moved
            names |= {o.target + n[len(o.path) :] for n in moved} | {o.target}
        elif o.op in ("unlink", "rmdir"):
            names = {n for n in names if n != o.path and not n.startswith(o.path + "/")}
    return names


def _touches(operation: Operation, names: set[str]) -> bool:
    """``operation`` changes one of ``names`` (or what lies under one): an open that does not
    truncate, a close and an fsync change no byte."""
    if operation.op in ("open", "close", "fsync"):
        return False
    touched = {operation.path, operation.target} - {""}
    return any(
        t == n or t.startswith(n + "/") or n.startswith(t + "/") for t in touched for n in names
    )
