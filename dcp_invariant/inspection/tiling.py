"""Whether a tensor's chunks tile its global shape exactly once: from offsets and sizes only.

DCP loads a tensor by reading, for each element, the saved chunks that hold it
(torch/distributed/checkpoint/planner_helpers.py ``create_read_items_for_chunk_list``): an
element no chunk holds is never read (it keeps whatever the destination held), and one two chunks
hold is read twice. The save planner checks this (default_planner.py ``_validate_global_plan``);
the load trusts whatever ``.metadata`` says.

The check is a signed corner count. A box ``[o, o + s)`` of the integer grid is the signed sum
of the orthant indicators at its 2**d corners (+1 at an even number of upper coordinates, -1
at an odd one), and orthant indicators at distinct corners are linearly independent. So the
chunks' indicators sum to the shape's indicator -- every element covered exactly once -- if and
only if the chunks' signed corners, minus the shape's, all cancel. That is O(n * 2**d)
for n chunks in d sharded dimensions (dimensions every chunk spans whole are left out first),
with no pairwise comparison. When they do not cancel, a prefix sum over the few corners left
gives each element's count less one: the first element counted twice and the first counted
never are named. Sharded along one dimension alone (FSDP's dim 0), the chunks' spans along it,
sorted, decide first; only when they do not follow one another is the corner count run, to name
what is wrong.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from dcp_invariant.inspection.budget import Budget
from dcp_invariant.inspection.problems import Problem
from dcp_invariant.inspection.records import Shape

# Corner updates one tensor may cost (chunks * 2**sharded dimensions); past it, the tensor is
# reported unchecked. Real checkpoints shard a tensor along at most three dimensions: a million
# chunks of a 2-D grid cost 4 million.
MAX_CORNERS: Final = 1 << 22
# Grid points inspect evaluates to place an overlap and a gap, once the corners do not cancel.
MAX_GRID: Final = 1 << 20
# Bad chunks of one tensor listed by index; the rest are counted.
MAX_LISTED: Final = 3


class Box(Protocol):
    """A chunk: ``records.ChunkStorageMetadata``, or :class:`Chunk`."""

    @property
    def offsets(self) -> Shape: ...

    @property
    def sizes(self) -> Shape: ...


_OFFSETS: Final = operator.attrgetter("offsets")
_SIZES: Final = operator.attrgetter("sizes")


@dataclass(frozen=True)
class Chunk:
    offsets: Shape
    sizes: Shape


def check_all(
    tensors: Iterable[tuple[str, Shape, Sequence[Box]]], budget: Budget | None = None
) -> list[Problem]:
    """:func:`check` of each (name, shape, chunks), in order.

    The tensors of one shape of a model are sharded alike: a layout found to tile with no work
    counted is not checked again, its verdict found by its values (a lookup, which compares the
    chunks' offsets and sizes, most of them one tuple each that the unpickler shares).
    """
    budget = Budget() if budget is None else budget
    problems: list[Problem] = []
    tiled: set[tuple[Shape, tuple[Shape, ...], tuple[Shape, ...]]] = set()
    for name, shape, chunks in tensors:
        offsets = tuple(map(_OFFSETS, chunks))
        sizes = tuple(map(_SIZES, chunks))
        layout = (shape, offsets, sizes)
        if layout in tiled:
            continue
        spent = budget.spent
        found = _check(name, shape, chunks, offsets, sizes, budget)
        if not found and budget.spent == spent:
            tiled.add(layout)
        problems += found
    return problems


def check(
    name: str, shape: Shape, chunks: Sequence[Box], budget: Budget | None = None
) -> list[Problem]:
    """Every way ``chunks`` fail to tile ``shape`` exactly once; empty when they do.

    The corners and grid cells counted are spent from ``budget`` (:mod:`.budget`): each tensor
    is bounded, but a file may hold many tensors.
    """
    budget = Budget() if budget is None else budget
    return _check(
        name, shape, chunks, tuple(map(_OFFSETS, chunks)), tuple(map(_SIZES, chunks)), budget
    )


def _check(
    name: str,
    shape: Shape,
    chunks: Sequence[Box],
    chunk_offsets: tuple[Shape, ...],
    chunk_sizes: tuple[Shape, ...],
    budget: Budget,
) -> list[Problem]:
    if any(d < 0 for d in shape):
        return [Problem("bad chunk", f"{name}: the global shape {shown(shape)} is negative")]
    # A tensor may have thousands of chunks, a checkpoint millions: what is checked of every
    # chunk is checked a dimension at a time, on columns of them (min, max, count and map over
    # a tuple run at C speed), and chunk by chunk only to say what is wrong.
    columns = _columns(shape, chunk_offsets, chunk_sizes)
    if columns is None:
        return _bad_chunks(name, shape, chunks)
    starts, spans = columns
    total = math.prod(shape)
    # A dimension every chunk spans whole cannot hold a gap or an overlap of its own.
    count = len(chunks)
    kept = [
        i
        for i, extent in enumerate(shape)
        if starts[i].count(0) != count or spans[i].count(extent) != count
    ]
    if total == 0:
        return []  # every chunk inside an empty shape is empty
    if len(kept) == 1 and _spans_tile(starts[kept[0]], spans, chunk_sizes, kept[0], shape[kept[0]]):
        return []
    boxes = [
        ([c.offsets[i] for i in kept], [c.sizes[i] for i in kept])
        for c in chunks
        if all(c.sizes)  # an empty chunk covers nothing
    ]
    covered = sum(math.prod(c.sizes) for c in chunks)
    if len(boxes) << len(kept) > MAX_CORNERS:
        return [
            Problem(
                "unchecked",
                f"{name}: {len(boxes)} chunks sharded along {len(kept)} dimensions are more "
                f"than the {MAX_CORNERS} corners inspect counts",
            )
        ]
    # Each corner is a tuple of the sharded dimensions: that many units of work.
    budget.spend(
        (len(boxes) << len(kept)) * max(1, len(kept)), f"{name}: the corners of its chunks"
    )
    weights: dict[tuple[int, ...], int] = {}
    for offsets, sizes in boxes:
        for corner, weight in _corners(offsets, sizes):
            weights[corner] = weights.get(corner, 0) + weight
    for corner, weight in _corners([0] * len(kept), [shape[i] for i in kept]):
        weights[corner] = weights.get(corner, 0) - weight
    left = {corner: weight for corner, weight in weights.items() if weight}
    if not left:
        return []
    over, under = _witnesses(left, name, budget)
    problems = []
    if over is not None:
        point, count = _element(shape, kept, over[0]), over[1]
        holders = [c for c in chunks if _holds(c, point)]
        held_at = " and ".join(shown(c.offsets) for c in holders[:2])
        problems.append(
            Problem(
                "overlap",
                f"{name}: element {shown(point)} is in {1 + count} chunks (at offsets {held_at})",
            )
        )
    if under is not None:
        problems.append(_gap(name, covered, total, _element(shape, kept, under[0])))
    if over is None and under is None:  # too many corners left to place: the volumes decide
        corner = min(left)
        if left[corner] > 0 or covered > total:
            problems.append(
                Problem("overlap", f"{name}: some element is in two chunks" + _held(covered, total))
            )
        if left[corner] < 0 or covered < total:
            problems.append(_gap(name, covered, total, None))
    return problems


def _spans_tile(
    lows: tuple[int, ...],
    spans: list[tuple[int, ...]],
    sizes: Sequence[Shape],
    dim: int,
    extent: int,
) -> bool:
    """Sharded along ``dim`` alone (FSDP's dim 0), the chunks tile the shape when their spans
    along it, sorted, follow one another from 0 to ``extent``: the corner count's verdict, for
    a sort. False sends the chunks to the corner count, which names what is wrong.

    ``lows`` are the chunks' offsets along ``dim``, ``spans`` their sizes along each dimension
    (``sizes`` chunk by chunk)."""
    starts = list(lows)
    ends = list(map(operator.add, lows, spans[dim]))
    if any(0 in column for column in spans):  # an empty chunk covers nothing
        covering = list(map(all, sizes))
        starts = list(itertools.compress(starts, covering))
        ends = list(itertools.compress(ends, covering))
    if not starts:
        return extent == 0
    if not all(map(operator.le, starts, itertools.islice(starts, 1, None))):
        # Out of order: sorted by where they start (and, for two that start together, end;
        # those do not tile either way).
        ordered = sorted(zip(starts, ends, strict=True))
        starts = list(map(operator.itemgetter(0), ordered))
        ends = list(map(operator.itemgetter(1), ordered))
    # Each span starts where the one before ended: the first at 0, the last ending at extent.
    return starts[0] == 0 and starts[1:] == ends[:-1] and ends[-1] == extent


def _columns(
    shape: Shape, offsets: Sequence[Shape], sizes: Sequence[Shape]
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]] | None:
    """The chunks' offsets and sizes a dimension at a time, if :func:`_bad_chunks` finds
    nothing (every chunk of the shape's rank, nothing negative, nothing past the shape);
    otherwise None, and it says what."""
    rank = len(shape)
    if set(map(len, offsets)) - {rank} or set(map(len, sizes)) - {rank}:
        return None
    if not offsets:
        return [()] * rank, [()] * rank
    starts = list(zip(*offsets, strict=True))
    spans = list(zip(*sizes, strict=True))
    for low, span, extent in zip(starts, spans, shape, strict=True):
        if min(low) < 0 or min(span) < 0 or max(map(operator.add, low, span)) > extent:
            return None
    return starts, spans


def _witnesses(
    left: dict[tuple[int, ...], int], name: str, budget: Budget
) -> tuple[tuple[tuple[int, ...], int] | None, tuple[tuple[int, ...], int] | None]:
    """The first element covered too often and the first covered too little, with how far off.

    The count of an element x, less 1 inside the shape, is the sum of the weights of the
    corners at or below x, so it is constant between the coordinates of the corners left over:
    a prefix sum over the grid they span gives it everywhere. (None, None) when that grid is
    larger than :data:`MAX_GRID`, or than what is left of ``budget``.
    """
    axes = [sorted({corner[i] for corner in left}) for i in range(len(next(iter(left))))]
    cells = math.prod(len(axis) for axis in axes)
    left_over = budget.left()
    if cells > MAX_GRID or (left_over is not None and cells * len(axes) > left_over):
        return None, None  # the witnesses are a courtesy: the volumes still tell gap from overlap
    budget.spend(cells * len(axes), f"{name}: the grid that places its overlap or gap")
    strides = [math.prod(len(axis) for axis in axes[i + 1 :]) for i in range(len(axes))]
    grid = [0] * cells
    places = [{value: j for j, value in enumerate(axis)} for axis in axes]
    for corner, weight in left.items():
        grid[sum(places[i][v] * strides[i] for i, v in enumerate(corner))] += weight
    for stride, axis in zip(strides, axes, strict=True):
        for index in range(cells):
            if (index // stride) % len(axis):
                grid[index] += grid[index - stride]
    over = next((i for i, v in enumerate(grid) if v > 0), None)
    under = next((i for i, v in enumerate(grid) if v < 0), None)

    def at(index: int | None) -> tuple[tuple[int, ...], int] | None:
        if index is None:
            return None
        point = tuple(
            axis[(index // stride) % len(axis)] for axis, stride in zip(axes, strides, strict=True)
        )
        return point, grid[index]

    return at(over), at(under)


def _element(shape: Shape, kept: list[int], corner: tuple[int, ...]) -> list[int]:
    # A dimension left out is spanned whole by every chunk: its first element stands for all.
    point = [0] * len(shape)
    for i, value in zip(kept, corner, strict=True):
        point[i] = value
    return point


def _held(covered: int, total: int) -> str:
    return f" (the chunks hold {covered} elements of {total}, counting overlaps)"


def _gap(name: str, covered: int, total: int, point: list[int] | None) -> Problem:
    where = "some element" if point is None else f"element {shown(point)}"
    return Problem("gap", f"{name}: {where} is in no chunk" + _held(covered, total))


def _bad_chunks(name: str, shape: Shape, chunks: Sequence[Box]) -> list[Problem]:
    problems = []
    rank = len(shape)
    for i, chunk in enumerate(chunks):
        offsets, sizes = chunk.offsets, chunk.sizes
        if len(offsets) != rank or len(sizes) != rank:
            problems.append(
                Problem("bad chunk", f"{_at(name, i, chunk)} does not have the {rank} dims")
            )
        elif rank and (min(offsets) < 0 or min(sizes) < 0):
            problems.append(Problem("bad chunk", f"{_at(name, i, chunk)} is negative"))
        elif any(map(operator.gt, map(operator.add, offsets, sizes), shape)):
            problems.append(
                Problem("out of bounds", f"{_at(name, i, chunk)} lies outside {shown(shape)}")
            )
    if len(problems) > MAX_LISTED:
        more = len(problems) - MAX_LISTED
        last = problems[MAX_LISTED - 1]
        problems[MAX_LISTED - 1 :] = [
            Problem(last.cause, f"{last.detail} (and {more} more bad chunks of {name})")
        ]
    return problems


def _at(name: str, i: int, chunk: Box) -> str:
    return f"{name}: chunk {i} at offsets {shown(chunk.offsets)} of sizes {shown(chunk.sizes)}"


def _corners(offsets: list[int], sizes: list[int]) -> list[tuple[tuple[int, ...], int]]:
    corners: list[tuple[tuple[int, ...], int]] = [((), 1)]
    for low, size in zip(offsets, sizes, strict=True):
        high = low + size
        corners = [((*c, low), w) for c, w in corners] + [((*c, high), -w) for c, w in corners]
    return corners


def _holds(chunk: Box, point: list[int]) -> bool:
    return all(o <= p < o + s for o, s, p in zip(chunk.offsets, chunk.sizes, point, strict=True))


def shown(values: Sequence[int]) -> str:
    """A shape or an offset as Python prints a tuple: ``(3, 0)``, ``(4,)``, ``()``."""
    return "(" + ", ".join(map(str, values)) + ("," if len(values) == 1 else "") + ")"
