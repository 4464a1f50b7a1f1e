"""The planner-free estimate of what each rank reads at another world size."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from inspect_data import parsed, tensor

from dcp_invariant.inspection import estimate, records
from dcp_invariant.inspection.budget import Budget
from dcp_invariant.inspection.errors import MetadataTooLarge


def stored(meta: records.Metadata, key: str) -> int:
    assert meta.storage_data is not None
    return sum(info.length for index, info in meta.storage_data.items() if index.fqn == key)


def test_at_world_size_1_every_tensor_is_one_whole_chunk_so_every_key_is_read_whole() -> None:
    meta = parsed(1)
    result = estimate.estimate(meta, 4)
    assert result.same_on_every_rank == tuple(meta.state_dict_metadata)
    total = sum(stored(meta, key) for key in meta.state_dict_metadata)
    assert result.bytes_per_rank == (total,) * 4


@pytest.mark.parametrize("world_size", [1, 3, 4])
def test_sharded_tensors_split_by_rows_and_the_rest_is_read_by_every_rank(world_size: int) -> None:
    meta = parsed(2)
    result = estimate.estimate(meta, world_size)
    sharded = [k for k, v in meta.state_dict_metadata.items() if k not in result.same_on_every_rank]
    # FSDP2's parameters and their Adam moments, saved as DTensors; the step counters are not.
    assert "model.0.weight" in sharded and "optim.state.0.weight.exp_avg" in sharded
    assert "optim.state.0.weight.step" in result.same_on_every_rank
    assert "extra.step" in result.same_on_every_rank
    whole = sum(stored(meta, key) for key in result.same_on_every_rank)
    split = sum(stored(meta, key) for key in sharded)
    assert sum(result.bytes_per_rank) == world_size * whole + split
    assert all(b >= whole for b in result.bytes_per_rank)


def test_the_largest_tensor_is_the_one_with_the_most_stored_bytes() -> None:
    meta = parsed(4)
    result = estimate.estimate(meta, 2)
    assert result.largest is not None
    weight = tensor(meta, result.largest.key)
    assert (result.largest.shape, result.largest.dtype) == (weight.size, "float32")
    assert result.largest.stored_bytes == max(
        stored(meta, key)
        for key, item in meta.state_dict_metadata.items()
        if isinstance(item, records.TensorStorageMetadata)
    )


def test_a_row_count_that_does_not_divide_leaves_the_last_ranks_less() -> None:
    # torch.chunk(10 rows, 4): 3, 3, 3, 1 rows.
    assert estimate._row_shares(1000, 10, 4) == [300, 300, 300, 100]
    # torch.chunk(3 rows, 4): 1, 1, 1, 0 rows; the rank without rows is left out.
    assert estimate._row_shares(30, 3, 4) == [10, 10, 10]
    # torch.chunk(5 rows, 4): 2, 2, 1, 0 rows.
    assert estimate._row_shares(50, 5, 4) == [20, 20, 10]


@settings(max_examples=200, deadline=None, database=None)
@given(st.integers(0, 10**12), st.integers(1, 10**6), st.integers(1, 512))
def test_row_shares_add_up_to_the_bytes_exactly(size: int, rows: int, world_size: int) -> None:
    shares = estimate._row_shares(size, rows, world_size)
    assert len(shares) == min(world_size, -(-rows // -(-rows // world_size)))
    assert sum(shares) == size and min(shares) >= 0


def test_each_sharded_tensor_spends_one_unit_a_rank_with_rows_and_a_whole_key_none() -> None:
    meta = parsed(2)
    sharded = [
        item.size[0]
        for key, item in meta.state_dict_metadata.items()
        if isinstance(item, records.TensorStorageMetadata) and estimate.is_sharded(item)
    ]
    budget = Budget(10**6)
    estimate.estimate(meta, 65536, budget)
    assert budget.spent == sum(sharded)  # each has fewer rows than ranks: a rank a row
    budget = Budget(10**6)
    estimate.estimate(meta, 2, budget)
    assert budget.spent == 2 * len(sharded)
    with pytest.raises(MetadataTooLarge, match=r": its share of each of \d+ ranks: the records"):
        estimate.estimate(meta, 65536, Budget(sum(sharded) - 1))
