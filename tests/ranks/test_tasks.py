"""How a resuming rank records a load DCP refused: its own failure, classified, path-free."""

from __future__ import annotations

import traceback
from typing import Any

import pytest

pytest.importorskip("torch")

from torch.distributed.checkpoint.api import CheckpointException

from dcp_invariant.evidence import observation
from dcp_invariant.plan import LOAD_FAILURES
from dcp_invariant.ranks.tasks import load_failure

pytestmark = pytest.mark.torch


def refused(failures: dict[int, BaseException]) -> CheckpointException:
    """What DCP raises on every rank: each rank's own exception with its stack."""
    return CheckpointException(
        "load failed", {r: (e, traceback.StackSummary()) for r, e in failures.items()}
    )


# The messages torch's default planner raises (create_default_local_load_plan in
# torch/distributed/checkpoint/default_planner.py).
MISSING = RuntimeError(
    "Missing key in checkpoint state_dict: app.data.rank_1._index_sampler_state."
)
SIZE = ValueError(
    "Size mismatch between saved torch.Size([4, 2]) and current: torch.Size([2, 2]) for "
    "app.model.0.weight"
)


@pytest.mark.parametrize(
    ("rank", "failures", "expected"),
    [
        (1, {1: MISSING}, ("missing key", "app.data.rank_1._index_sampler_state", None)),
        (0, {0: SIZE}, ("size mismatch", "app.model.0.weight", None)),
        (0, {1: MISSING}, ("another rank", None, None)),
        # Anything else: only its type, as its message may hold a path.
        (
            0,
            {0: OSError(2, "No such file", "/home/me/ckpt/.metadata")},
            ("error", None, "FileNotFoundError"),
        ),
    ],
)
def test_a_rank_records_its_own_failure_by_kind(
    rank: int, failures: dict[int, BaseException], expected: tuple[str, str | None, str | None]
) -> None:
    record = load_failure(refused(failures), rank)

    assert (record["kind"], record["key"], record["exception"]) == expected
    assert record["kind"] in LOAD_FAILURES
    assert "/home/me" not in repr(record)
    # What the worker records is what a fixture observation's target rank may hold.
    shape = observation.fixture_resume_rank
    rank_record: dict[str, Any] = {
        "rank": rank,
        "generation": None,
        "verified_before_load": True,
        "verified_after_load": True,
        "refused": [],
        "loaded": None,
        "load_error": record,
        "steps": [],
        "diffs": [],
        "objects": {"final": None, "loaded": None},
    }
    assert shape(rank_record, "rank") == []


def test_each_task_reads_the_payload_type_its_drivers_are_held_to() -> None:
    """payloads.Task pairs a task with the payload type mypy holds the drivers to: the function
    a worker runs must read that same type, and every task function must have its Task."""
    import inspect
    import typing

    from dcp_invariant.ranks import fixture_tasks, tasks
    from dcp_invariant.suite import worker
    from dcp_invariant.suite.scenarios import payloads

    for task in payloads.TASKS:
        function = worker.resolve(task.ref)
        assert typing.get_type_hints(function)["payload"] is task.payload, task.ref
    parameters = ["rank", "world_size", "payload", "report"]
    found = {
        f"{module.__name__}:{name}"
        for module in (tasks, fixture_tasks)
        for name, function in vars(module).items()
        if inspect.isfunction(function)
        and function.__module__ == module.__name__
        and list(inspect.signature(function).parameters) == parameters
    }
    assert found == {task.ref for task in payloads.TASKS}
