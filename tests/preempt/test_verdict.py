"""The verdict at each crash point, from the relaunch's record alone."""

from __future__ import annotations

from dcp_invariant.evidence import diagnosis
from dcp_invariant.evidence.preempt.operations import Numbering, Operation, Point
from dcp_invariant.evidence.preempt.verdict import Relaunch, judged

REFERENCE = {1: ["a"], 2: ["b"], 3: ["c"], 4: ["d"]}


def two_saves() -> list[Operation]:
    numbering = Numbering()
    lines = [
        ("truncate-open", "ckpt.tmp", 2),
        ("close", "ckpt.tmp", 2),
        ("rename", "ckpt.tmp", 2),
        ("truncate-open", "ckpt.tmp", 4),
        ("close", "ckpt.tmp", 4),
        ("rename", "ckpt.tmp", 4),
    ]
    made = [numbering.parse(f"{op}\tmain\t{path}\t", s) for op, path, s in lines]
    return [
        Operation(o.rank, o.op, o.path, "ckpt" if o.op == "rename" else "", o.index, o.steps_before)
        for o in made
        if o is not None
    ]


def relaunch(code: int | None = 0, first: int = 3, final: str | None = None) -> Relaunch:
    return {"exit_code": code, "steps": {s: REFERENCE[s] for s in range(first, 5)}, "final": final}


def test_a_job_that_resumes_from_its_newest_whole_save_passes() -> None:
    operations = two_saves()
    relaunches: dict[Point, Relaunch] = {
        ("kill", "main", 0): relaunch(first=1),
        ("kill", "main", 2): relaunch(first=1),
        ("kill", "main", 3): relaunch(first=3),  # right after the first save: it resumes from it
        ("kill", "main", 5): relaunch(first=3),
    }
    assert all(r == [] for r in judged(operations, relaunches, REFERENCE, 60, 30).values())


def test_a_relaunch_that_starts_over_beside_a_whole_save_lost_it() -> None:
    operations = two_saves()
    relaunches: dict[Point, Relaunch] = {
        ("kill", "main", 3): relaunch(first=3),
        ("kill", "main", 5): relaunch(first=1),
    }
    (reason,) = judged(operations, relaunches, REFERENCE, 60, 30)[("kill", "main", 5)]
    assert reason.startswith(f"{diagnosis.LOST_CHECKPOINT}: killed before rank main operation 5")
    assert "started over, though the save after step 2 was whole" in reason


def test_a_relaunch_that_fails_or_hangs_cannot_resume() -> None:
    operations = two_saves()
    relaunches: dict[Point, Relaunch] = {
        ("kill", "main", 1): relaunch(code=1),
        ("kill", "main", 4): relaunch(code=None),
    }
    verdicts = judged(operations, relaunches, REFERENCE, 60, 30)
    assert verdicts[("kill", "main", 1)][0].startswith(f"{diagnosis.CANNOT_RESUME}: ")
    assert "exited with code 1" in verdicts[("kill", "main", 1)][0]
    assert "timed out after 60 s" in verdicts[("kill", "main", 4)][0]


def test_other_steps_or_another_final_state_is_another_result() -> None:
    operations = two_saves()
    wrong = relaunch(first=1)
    wrong["steps"][3] = ["x"]
    relaunches: dict[Point, Relaunch] = {
        ("kill", "main", 0): wrong,
        ("kill", "main", 1): relaunch(first=1, final="w.pt: its bytes differ"),
    }
    verdicts = judged(operations, relaunches, REFERENCE, 60, 30)
    assert verdicts[("kill", "main", 0)] == [
        f"{diagnosis.OTHER_RESULT}: killed before rank main operation 0 (truncate-open "
        "ckpt.tmp), after step 2: step 3: loss x, the uninterrupted run c"
    ]
    assert verdicts[("kill", "main", 1)][0].endswith(
        "the final state differs: w.pt: its bytes differ"
    )


def test_a_sigterm_point_is_named_by_its_signal_and_judged_alike() -> None:
    operations = two_saves()
    relaunches: dict[Point, Relaunch] = {
        ("kill", "main", 3): relaunch(first=3),
        ("term", "main", 3): relaunch(first=1),
    }
    verdicts = judged(operations, relaunches, REFERENCE, 60, 30)
    assert verdicts[("kill", "main", 3)] == []
    (reason,) = verdicts[("term", "main", 3)]
    assert reason.startswith(
        f"{diagnosis.LOST_CHECKPOINT}: sent SIGTERM before rank main operation 3 (truncate-open "
        "ckpt.tmp), after step 4 (SIGKILL 30 s later): the relaunch started over"
    )


def test_a_step_past_the_end_counts_only_where_the_final_state_cannot_say() -> None:
    """Trainer resumed from its last checkpoint runs one more training_step, which prints a
    step line past the end and changes no weight: with --final equal, that is no difference."""
    operations = two_saves()
    extra = relaunch(first=3)
    extra["steps"][5] = ["e"]
    relaunches: dict[Point, Relaunch] = {
        ("kill", "main", 3): relaunch(first=3),
        ("kill", "main", 4): extra,
    }
    assert (
        judged(operations, relaunches, REFERENCE, 60, 30, final_compared=True)[("kill", "main", 4)]
        == []
    )
    (reason,) = judged(operations, relaunches, REFERENCE, 60, 30)[("kill", "main", 4)]
    assert reason.endswith("step 5 was printed, which the uninterrupted run never reached")
    extra["final"] = "w.pt: its bytes differ"  # the extra step changed what the job keeps
    reasons = judged(operations, relaunches, REFERENCE, 60, 30, final_compared=True)
    assert len(reasons[("kill", "main", 4)]) == 2
