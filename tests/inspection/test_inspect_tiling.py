"""The tiling check against a brute-force count of every element, and on the shapes DCP saves."""

from __future__ import annotations

import itertools
import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dcp_invariant.inspection import tiling
from dcp_invariant.inspection.budget import Budget
from dcp_invariant.inspection.tiling import Chunk


def causes(shape: tuple[int, ...], chunks: list[Chunk]) -> list[str]:
    return [p.cause for p in tiling.check("t", shape, chunks)]


def fsdp_chunks(rows: int, cols: int, world_size: int) -> list[Chunk]:
    """What FSDP2 saves of a (rows, cols) parameter: torch.chunk along dim 0, empty shards kept."""
    per = -(-rows // world_size)
    return [
        Chunk((min(rows, r * per), 0), (max(0, min(rows, (r + 1) * per) - r * per), cols))
        for r in range(world_size)
    ]


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7, 16])
def test_fsdp_shards_tile_even_with_empty_ones(world_size: int) -> None:
    assert tiling.check("w", (3, 10), fsdp_chunks(3, 10, world_size)) == []


def test_a_two_dimensional_grid_tiles() -> None:
    chunks = [Chunk((r, c), (2, 3)) for r in range(0, 6, 2) for c in range(0, 9, 3)]
    assert tiling.check("w", (6, 9), chunks) == []


def test_a_scalar_and_an_empty_tensor() -> None:
    assert tiling.check("s", (), [Chunk((), ())]) == []
    assert causes((), []) == ["gap"]
    assert causes((), [Chunk((), ()), Chunk((), ())]) == ["overlap"]
    assert tiling.check("e", (0, 4), [Chunk((0, 0), (0, 4))]) == []
    assert tiling.check("e", (0, 4), []) == []


def test_an_overlap_names_the_element_and_the_chunks() -> None:
    (problem,) = tiling.check("w", (10, 8), [Chunk((0, 0), (5, 8)), Chunk((4, 0), (6, 8))])
    assert (
        str(problem) == "overlap: w: element (4, 0) is in 2 chunks (at offsets (0, 0) and (4, 0))"
    )


def test_a_gap_names_the_first_element_in_no_chunk() -> None:
    (problem,) = tiling.check("w", (10, 8), [Chunk((0, 0), (5, 8)), Chunk((6, 0), (4, 8))])
    assert str(problem) == (
        "gap: w: element (5, 0) is in no chunk (the chunks hold 72 elements of 80, counting "
        "overlaps)"
    )


def test_an_overlap_that_fills_the_volume_also_reports_the_gap_it_leaves() -> None:
    chunks = [Chunk((0, 0), (2, 2)), Chunk((2, 0), (2, 2)), Chunk((0, 2), (2, 2))]
    chunks.append(Chunk((1, 1), (2, 2)))  # the volume adds up to 16, yet (2, 2) is missed
    assert causes((4, 4), chunks) == ["overlap", "gap"]


def test_a_doubled_chunk_that_leaves_elements_out_reports_both() -> None:
    # Found by the brute-force comparison below: 2 of 3 elements held, one of them twice.
    doubled = [Chunk((1,), (1,)), Chunk((0,), (0,)), Chunk((1,), (1,))]
    assert [str(p) for p in tiling.check("t", (3,), doubled)] == [
        "overlap: t: element (1,) is in 2 chunks (at offsets (1,) and (1,))",
        "gap: t: element (0,) is in no chunk (the chunks hold 2 elements of 3, counting overlaps)",
    ]


@pytest.mark.parametrize(
    ("chunk", "cause"),
    [
        (Chunk((0, 0), (2, 5)), "out of bounds"),
        (Chunk((3, 0), (2, 4)), "out of bounds"),
        (Chunk((0,), (4,)), "bad chunk"),
        (Chunk((0, -1), (4, 4)), "bad chunk"),
    ],
)
def test_chunks_outside_the_shape_are_named(chunk: Chunk, cause: str) -> None:
    assert causes((4, 4), [chunk]) == [cause]


def test_many_bad_chunks_are_counted_not_listed() -> None:
    problems = tiling.check("w", (4,), [Chunk((i,), (9,)) for i in range(10)])
    assert len(problems) == tiling.MAX_LISTED
    assert problems[-1].detail.endswith("(and 7 more bad chunks of w)")


def test_a_tensor_past_the_corner_budget_is_reported_unchecked() -> None:
    # 2**20 sharded dimensions' worth of corners: refused before any is counted.
    shape = (2,) * 21
    chunks = [Chunk((0,) * 21, (1,) * 21), Chunk((1,) + (0,) * 20, (1,) * 21)]
    started = time.perf_counter()
    assert causes(shape, chunks * 2) == ["unchecked"]
    assert time.perf_counter() - started < 1


def test_a_hundred_thousand_chunks_are_checked_fast() -> None:
    chunks = fsdp_chunks(100_000, 64, 100_000)
    started = time.perf_counter()
    assert tiling.check("w", (100_000, 64), chunks) == []
    chunks[500] = Chunk((501, 0), (1, 64))
    assert sorted(causes((100_000, 64), chunks)) == ["gap", "overlap"]
    assert time.perf_counter() - started < 10


def test_check_all_is_check_of_each_tensor_and_counts_the_same_work() -> None:
    """A layout seen again is found by its values: the verdicts and the work are each tensor's
    own, problems and 2-D grids (whose corners are work) included."""
    good = fsdp_chunks(10, 4, 4)
    gap = good[:-1]
    grid = [Chunk((r, c), (3, 2)) for r in (0, 3) for c in (0, 2)]
    tensors = [
        ("a", (10, 4), good),
        ("b", (10, 4), list(good)),  # equal chunks, other objects
        ("c", (10, 4), gap),
        ("d", (10, 4), list(gap)),
        ("e", (6, 4), grid),
        ("f", (6, 4), list(grid)),
        ("g", (10, 5), good),  # the same chunks, another shape
    ]
    one_by_one = Budget()
    expected = [
        p for name, shape, chunks in tensors for p in tiling.check(name, shape, chunks, one_by_one)
    ]
    budget = Budget()
    assert tiling.check_all(tensors, budget) == expected
    assert budget.spent == one_by_one.spent > 0
    assert {p.detail.split(":")[0] for p in expected} == {"c", "d", "g"}


# --- against a brute-force count of every element ------------------------------------------


@st.composite
def _boxes(draw: st.DrawFn) -> tuple[tuple[int, ...], list[Chunk]]:
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=0, max_size=3)))
    chunks = []
    for _ in range(draw(st.integers(0, 6))):
        offsets = tuple(draw(st.integers(0, d)) for d in shape)
        sizes = tuple(draw(st.integers(0, d - o)) for d, o in zip(shape, offsets, strict=True))
        chunks.append(Chunk(offsets, sizes))
    return shape, chunks


@st.composite
def _partition(draw: st.DrawFn) -> tuple[tuple[int, ...], list[Chunk]]:
    """An exact tiling: each dimension cut at random points, one chunk per cell of the grid."""
    shape = tuple(draw(st.lists(st.integers(1, 30), min_size=1, max_size=3)))
    cuts = [sorted({0, d, *draw(st.lists(st.integers(0, d), max_size=4))}) for d in shape]
    chunks = [
        Chunk(tuple(lo for lo, _ in cell), tuple(hi - lo for lo, hi in cell))
        for cell in itertools.product(*[list(itertools.pairwise(c)) for c in cuts])
    ]
    return shape, draw(st.permutations(chunks))


def _coverage(shape: tuple[int, ...], chunks: list[Chunk]) -> list[int]:
    counts = []
    for point in itertools.product(*[range(d) for d in shape]):
        counts.append(sum(tiling._holds(c, list(point)) for c in chunks))
    return counts


@settings(max_examples=400, deadline=None, database=None)
@given(_boxes())
def test_the_verdict_is_the_brute_force_count(case: tuple[tuple[int, ...], list[Chunk]]) -> None:
    shape, chunks = case
    counts = _coverage(shape, chunks)
    found = set(causes(shape, chunks))
    assert ("overlap" in found) == any(c > 1 for c in counts)
    assert ("gap" in found) == any(c == 0 for c in counts)
    for problem in tiling.check("t", shape, chunks):
        if problem.detail.startswith("t: element"):  # the witness is what it says it is
            point = eval(problem.detail.split("element ")[1].split(" is")[0])
            index = list(itertools.product(*[range(d) for d in shape])).index(tuple(point))
            assert (counts[index] == 0) == (problem.cause == "gap")


@settings(max_examples=200, deadline=None, database=None)
@given(_partition(), st.data())
def test_a_partition_tiles_and_any_chunk_removed_or_doubled_is_caught(
    case: tuple[tuple[int, ...], list[Chunk]], data: st.DataObject
) -> None:
    shape, chunks = case
    assert tiling.check("t", shape, chunks) == []
    assert sum(math.prod(c.sizes) for c in chunks) == math.prod(shape)
    i = data.draw(st.integers(0, len(chunks) - 1))
    assert causes(shape, chunks[:i] + chunks[i + 1 :]) == ["gap"]
    assert causes(shape, [*chunks, chunks[i]]) == ["overlap"]
