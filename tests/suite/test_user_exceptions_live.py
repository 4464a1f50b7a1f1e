"""What the user's own code raises, whatever its base class, is named with the method it came
from; a refusal of a checkpoint cut short by any exception is a refusal; a rank that leaves
without reporting says so."""

from __future__ import annotations

import fixture_runs
import pytest

from dcp_invariant.evidence import diagnosis

pytestmark = pytest.mark.live


@pytest.mark.parametrize(
    ("where", "raised", "exception"),
    [
        ("step", "keyboard_interrupt", "KeyboardInterrupt"),
        ("load_state_dict", "checkpoint_exception", "CheckpointException"),
    ],
)
def test_what_the_loop_raises_is_named_with_its_method(
    where: str, raised: str, exception: str
) -> None:
    reasons, _ = fixture_runs.run(
        "raising_loops:raises_after_the_load",
        ["resume_1"],
        (1,),
        fixture_args={"where": where, "raised": raised},
    )
    cause = diagnosis.APP_RAISED[where]  # type: ignore[index]
    assert reasons["resume_1"] == [
        f"{cause}: resumed group rank 0: {exception}; its traceback is in the worker's log"
    ]


@pytest.mark.parametrize(
    ("raised", "exception"),
    [("checkpoint_exception", "CheckpointException")],
)
def test_what_the_apps_own_load_raises_is_its_own(raised: str, exception: str) -> None:
    """Not ``a load error of kind 'another rank'``: the loop's CheckpointException is not DCP's."""
    reasons, _ = fixture_runs.run(
        "raising_loops:load_raises", ["resume_1"], (1,), fixture_args={"raised": raised}
    )
    (reason,) = reasons["resume_1"]
    assert reason.startswith(f"{diagnosis.APP_ROUND_TRIP}: ")
    assert f"the app's own load() raised {exception} " in reason


@pytest.mark.parametrize("how", ["os_exit", "sys_exit"])
def test_a_rank_that_leaves_without_reporting_says_so(how: str) -> None:
    reasons, _ = fixture_runs.run(
        "raising_loops:leaves_quietly", ["resume_1"], (1,), fixture_args={"how": how}
    )
    (reason,) = reasons["resume_1"]
    if how == "os_exit":
        assert reason.startswith(
            f"{diagnosis.NO_REPORT}: resumed group rank 0: exited with code 0 before its task finished"
        )
    else:  # raised inside step(): named as what it is
        assert reason == (
            f"{diagnosis.APP_RAISED['step']}: resumed group rank 0: SystemExit; its traceback "
            "is in the worker's log"
        )


def test_a_dcp_refusal_of_a_cut_copy_by_the_apps_own_load_passes() -> None:
    """torchtitan's way: the app's own dcp.load raises a CheckpointException on the copy."""
    reasons, observations = fixture_runs.run(
        "raising_loops:dcp_by_itself", ["half_written_2"], (2,)
    )
    assert reasons["half_written_2"] == []
    ranks = observations["half_written_2"]["cut_load"]["ranks"]
    assert [r["exception"] for r in ranks] == ["CheckpointException"] * 2
