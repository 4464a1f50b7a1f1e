"""A state dict recorded key by key: its leaves' paths, what a record says, what DCP cannot save,
and which keys of a resumed state differ from the reference, by how much."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from dcp_invariant.ranks import state_keys  # noqa: E402 (needs torch, which may be absent)
from dcp_invariant.ranks.digest import value_digest  # noqa: E402

pytestmark = pytest.mark.torch

# --- flatten: a leaf per dotted path ----------------------------------------------------------


def test_leaves_are_named_by_dotted_path_mapping_keys_sorted_sequences_in_order() -> None:
    weight = torch.zeros(2)
    state = {
        "optimizer": {"state": {10: {"step": 3}, 2: {"step": 1}}, "param_groups": [{"lr": 0.1}]},
        "model": {"weight": weight, "bias": torch.ones(1)},
        "data": ("epoch", 7, 0.5),
    }
    leaves = state_keys.flatten(state)
    # Keys sorted as strings ("10" before "2"), a sequence's items by position; a tensor is a
    # leaf, never iterated.
    assert list(leaves) == [
        "app.data.0",
        "app.data.1",
        "app.data.2",
        "app.model.bias",
        "app.model.weight",
        "app.optimizer.param_groups.0.lr",
        "app.optimizer.state.10.step",
        "app.optimizer.state.2.step",
    ]
    assert leaves["app.model.weight"] is weight
    assert leaves["app.data.2"] == 0.5
    assert list(state_keys.flatten({"x": 1}, prefix="rank_0")) == ["rank_0.x"]


def test_an_empty_container_is_a_leaf_of_its_own() -> None:
    """Else a key whose value went from ``{}`` to ``{"a": 1}`` would have no record to differ."""
    leaves = state_keys.flatten({"buffers": {}, "queue": [], "pair": (), "full": {"a": []}})
    assert leaves == {"app.buffers": {}, "app.full.a": [], "app.pair": (), "app.queue": []}
    assert type(leaves["app.pair"]) is tuple and type(leaves["app.queue"]) is list


def test_a_state_dict_of_more_than_max_keys_leaves_is_refused() -> None:
    assert len(state_keys.flatten({"ids": list(range(state_keys.MAX_KEYS))})) == (
        state_keys.MAX_KEYS
    )
    with pytest.raises(state_keys.StateKeyError, match=f"more than {state_keys.MAX_KEYS} leaves"):
        state_keys.flatten({"ids": list(range(state_keys.MAX_KEYS + 1))})


# --- describe and record: "<type> <sha256>" ----------------------------------------------------


@pytest.mark.parametrize(
    ("value", "described"),
    [
        (torch.zeros(2, 3), "float32[2,3]"),
        (torch.zeros((), dtype=torch.int64), "int64[]"),
        (torch.zeros(4, dtype=torch.bfloat16), "bfloat16[4]"),
        ({}, "map[0]"),
        ([], "list[0]"),
        ((), "tuple[0]"),
        (3, "int"),
        (True, "bool"),
        (0.5, "float"),
        ("x", "str"),
        (None, "NoneType"),
    ],
)
def test_a_leaf_is_described_by_dtype_and_shape_or_its_python_type(
    value: Any, described: str
) -> None:
    assert state_keys.describe(value) == described


def test_a_record_is_the_leafs_description_and_sha256() -> None:
    weight = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    records = state_keys.record({"app.w": weight, "app.step": 3, "app.seen": {}})
    assert records == {
        "app.w": f"float32[2,3] {value_digest(weight)}",
        "app.step": f"int {value_digest(3)}",
        "app.seen": f"map[0] {value_digest({})}",
    }
    digest = records["app.w"].split(" ")[1]
    assert len(digest) == len(hashlib.sha256().hexdigest()) and int(digest, 16) >= 0


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (torch.zeros(4), torch.tensor([0.0, 0.0, 0.0, 1e-30])),  # one element, however small
        (torch.zeros(4), torch.zeros(2, 2)),  # same bytes, another shape
        (torch.zeros(4), torch.zeros(4, dtype=torch.int32)),  # same bytes, another dtype
        (1, True),  # equal in Python, another type
        (0.1, math.nextafter(0.1, 1.0)),  # the last bit of a float
    ],
    ids=["element", "shape", "dtype", "type", "float-bit"],
)
def test_a_changed_leaf_changes_its_record(before: Any, after: Any) -> None:
    assert state_keys.record({"k": before}) != state_keys.record({"k": after})


def test_equal_leaves_have_equal_records_whatever_their_layout() -> None:
    data = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    transposed = data.t().contiguous().t()  # the same values with other strides
    assert not transposed.is_contiguous()
    assert state_keys.record({"k": data}) == state_keys.record({"k": transposed})


# --- gather and full: every leaf as its global value on the CPU -------------------------------


def test_gather_flattens_and_detaches_every_tensor() -> None:
    weight = torch.ones(2, requires_grad=True)
    gathered = state_keys.gather({"model": {"w": weight}, "step": 4})
    assert list(gathered) == ["app.model.w", "app.step"]
    assert not gathered["app.model.w"].requires_grad
    assert torch.equal(gathered["app.model.w"], weight.detach())
    assert gathered["app.step"] == 4


def test_a_dtensor_is_recorded_as_its_global_value(one_rank_group: Any) -> None:
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    plain = torch.arange(6, dtype=torch.float32).reshape(3, 2)
    sharded = distribute_tensor(plain, one_rank_group, [Shard(0)])
    assert isinstance(sharded, DTensor)

    full = state_keys.full(sharded)
    assert type(full) is torch.Tensor and torch.equal(full, plain)
    gathered = state_keys.gather({"w": sharded})
    assert type(gathered["app.w"]) is torch.Tensor
    assert state_keys.record(gathered) == state_keys.record({"app.w": plain})
    assert state_keys.refusal({"w": sharded}) is None
    assert state_keys.full(5) == 5  # a Python value is its own global value


# --- refusal: what DCP cannot save, named by key -----------------------------------------------


# torch warns that sparse CSR and nested tensors are beta or prototype, and that quantized
# tensors are deprecated: those are the tensors this test is about.
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_state_dcp_saves_and_loads_is_not_refused() -> None:
    state = {
        "model": {"w": torch.zeros(2, 3).t(), "flag": torch.zeros(2, dtype=torch.bool)},
        "complex": torch.zeros(2, dtype=torch.complex64),
        "quantized": torch.quantize_per_tensor(torch.zeros(2), 0.1, 0, torch.qint8),
        "float8": torch.zeros(2, dtype=torch.float8_e4m3fn),
        "step": 3,
        "empty": {},
    }
    assert state_keys.refusal(state) is None


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    ("make", "says"),
    [
        (
            lambda: torch.zeros(2).to_sparse(),
            "a sparse tensor (layout torch.sparse_coo, device cpu), which DCP cannot save",
        ),
        (
            lambda: torch.zeros(2, 2).to_sparse_csr(),
            "a sparse tensor (layout torch.sparse_csr, device cpu), which DCP cannot save",
        ),
        (
            lambda: torch.empty(2, device="meta"),
            "a tensor on the meta device (layout torch.strided, device meta), which DCP "
            "cannot save",
        ),
        (
            lambda: torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)]),
            "a nested tensor (layout torch.strided, device cpu), which DCP cannot save",
        ),
        (
            lambda: torch.zeros(3).expand(2, 3),
            "an expanded tensor (layout torch.strided, device cpu, strides [0, 1]), which DCP "
            "saves but cannot load into",
        ),
    ],
    ids=["sparse-coo", "sparse-csr", "meta", "nested", "expanded"],
)
def test_a_tensor_dcp_cannot_save_or_load_is_named_by_key_with_the_fix(
    make: Callable[[], Any], says: str
) -> None:
    """Made inside the test: torch's warnings on making them are filtered only there."""
    problem = state_keys.refusal({"model": {"ok": torch.zeros(1), "bad": make()}, "step": 1})
    assert problem is not None
    assert problem.startswith(f"app.model.bad, {says}: "), problem
    # What to do instead follows, on the same line.
    assert "\n" not in problem and len(problem) > len(f"app.model.bad, {says}: ") + 20


def test_of_several_unsavable_tensors_the_first_key_in_order_is_named() -> None:
    meta = torch.empty(1, device="meta")
    problem = state_keys.refusal({"z": meta, "b": {"y": meta}, "a": torch.zeros(3).expand(2, 3)})
    assert problem is not None and problem.startswith("app.a, an expanded tensor"), problem


# --- snapshots and differences -----------------------------------------------------------------


def _snapshot(tmp_path: Path, state: dict[str, Any]) -> Any:
    leaves = state_keys.gather(state)
    path = tmp_path / "rank_0.after.json"
    state_keys.save_snapshot(leaves, state_keys.record(leaves), path)
    return state_keys.load_snapshot(path)


def test_a_snapshot_keeps_the_records_and_only_the_non_empty_floating_point_values(
    tmp_path: Path,
) -> None:
    weight = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    state = {
        "w": weight,
        "w_t": weight.t(),  # non-contiguous: saved as its values, not its storage
        "half": torch.tensor([1.5, -2.25], dtype=torch.bfloat16),
        "ints": torch.arange(3),
        "empty": torch.zeros(0),
        "lr": 0.1,
    }
    snapshot = _snapshot(tmp_path, state)

    assert snapshot.keys == state_keys.record(state_keys.gather(state))
    assert snapshot.data == tmp_path / "rank_0.after.bin"
    assert sorted(snapshot.tensors) == ["app.half", "app.w", "app.w_t"]
    for key, original in (("app.w", weight), ("app.w_t", weight.t()), ("app.half", state["half"])):
        value = snapshot.value(key)
        assert value is not None and value.dtype == original.dtype, key
        assert value.shape == original.shape and torch.equal(value, original), key
    for key in ("app.ints", "app.empty", "app.lr", "app.absent"):
        assert snapshot.value(key) is None, key


def test_differences_name_the_keys_that_differ_and_by_how_much(tmp_path: Path) -> None:
    reference = {
        "w": torch.zeros(2, 2),
        "b": torch.ones(3),
        "grown": torch.zeros(2),
        "step": 5,
        "same": torch.full((2,), 7.0),
        "dropped": 1,
    }
    expected = _snapshot(tmp_path, reference)
    resumed = {
        "w": torch.tensor([[0.0, 0.5], [-0.25, 0.0]]),
        "b": torch.tensor([1.0, float("nan"), 1.0]),
        "grown": torch.zeros(3),  # another shape: no difference to measure
        "step": 6,
        "same": torch.full((2,), 7.0),
        "added": 2,  # a key on one side only is not a difference of values
    }
    got = state_keys.gather(resumed)

    diffs = state_keys.differences(expected, state_keys.record(got), got, "after")
    assert diffs == [
        {"key": "app.b", "max_abs_diff": "nan", "phase": "after"},
        {"key": "app.grown", "max_abs_diff": None, "phase": "after"},
        {"key": "app.step", "max_abs_diff": None, "phase": "after"},
        {"key": "app.w", "max_abs_diff": (0.5).hex(), "phase": "after"},
    ]


def test_only_keys_whose_records_differ_are_read_back(tmp_path: Path) -> None:
    """Comparing costs reading the records: a snapshot's values are read for differing keys
    alone, so equal states compare without opening its data."""
    state = {"w": torch.ones(4), "step": 1}
    snapshot = _snapshot(tmp_path, state)
    snapshot.data.unlink()
    got = state_keys.gather(state)
    assert state_keys.differences(snapshot, state_keys.record(got), got, "before") == []


def test_at_most_max_diffs_per_phase_are_reported_the_first_in_key_order(tmp_path: Path) -> None:
    count = state_keys.MAX_DIFFS_PER_PHASE + 5
    expected = _snapshot(tmp_path, {f"k{i:03d}": i for i in range(count)})
    got = state_keys.gather({f"k{i:03d}": i + 1 for i in range(count)})
    diffs = state_keys.differences(expected, state_keys.record(got), got, "after")
    assert [d["key"] for d in diffs] == [
        f"app.k{i:03d}" for i in range(state_keys.MAX_DIFFS_PER_PHASE)
    ]
