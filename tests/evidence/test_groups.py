"""A worker group's exits, by cause: what the user's code raised, a rank that left before its
task finished, one that failed after it reported; and nothing more where the group timed out."""

from __future__ import annotations

from typing import Any

from dcp_invariant.evidence import diagnosis
from dcp_invariant.evidence.checks import json_object
from dcp_invariant.evidence.families._groups import ended_early, group_finished
from dcp_invariant.evidence.families._record_parts import group
from dcp_invariant.evidence.families.records import GroupRecord


def a_group(codes: list[int], reported: list[int], **extra: Any) -> GroupRecord:
    record: GroupRecord = {
        "exit_codes": codes,
        "timed_out": False,
        "ranks": [{"rank": r} for r in reported],
    }
    record.update(extra)  # type: ignore[typeddict-item]
    assert group(json_object)(record, "group") == []
    return record


def test_what_the_users_code_raised_is_the_reason_with_its_method() -> None:
    raised = [{"exception": "CheckpointException", "method": "load_state_dict", "rank": 1}]
    record = a_group([0, 1], [0], raised=raised)
    assert group_finished(record, 2, "resumed group") == [
        "the app's load_state_dict() raised: resumed group rank 1: CheckpointException; its "
        "traceback is in the worker's log"
    ]
    assert ended_early(record)


def test_a_rank_that_left_before_its_task_finished_is_named_whatever_its_code() -> None:
    record = a_group([0, 0], [0, 1], unfinished=[1])
    (reason,) = group_finished(record, 2, "source")
    assert reason.startswith(
        f"{diagnosis.NO_REPORT}: source rank 1: exited with code 0 before its task finished"
    )
    (reason,) = group_finished(a_group([0, 7], [0]), 2, "source")
    assert reason.startswith(f"{diagnosis.NO_REPORT}: source rank 1: exited with code 7 ")


def test_a_rank_that_failed_after_it_reported_has_its_own_cause() -> None:
    record = a_group([0, 3], [0, 1])
    assert group_finished(record, 2, "source") == [
        f"{diagnosis.RANK_FAILED}: source rank 1: exited with code 3; its log says why"
    ]
    assert not ended_early(record)


def test_a_rank_stopped_at_a_non_finite_loss_is_left_to_the_family() -> None:
    record = a_group([0, 1], [0], unfinished=[1])
    record["ranks"].append({"rank": 1, "losses_before": ["nan"], "steps": []})
    assert group_finished(record, 2, "source") == []
    assert not ended_early(record)


def test_a_group_that_timed_out_says_only_that() -> None:
    record = a_group([0, -9], [0])
    record["timed_out"] = True
    (reason,) = group_finished(record, 2, "target")
    assert reason.startswith(f"{diagnosis.TIMEOUT}: target: timed out")


def test_every_rank_exit_cause_is_ranked() -> None:
    causes = [*diagnosis.APP_RAISED.values(), diagnosis.NO_REPORT, diagnosis.RANK_FAILED]
    assert all(c in diagnosis.RANKED_CAUSES for c in causes)
    assert diagnosis.APP_RAISED["fixture"] == "the fixture raised"
