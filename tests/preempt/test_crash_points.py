"""Crash points chosen from a job's operations, and the saves whole at each."""

from __future__ import annotations

from dcp_invariant.evidence.preempt.operations import (
    Numbering,
    Operation,
    chosen,
    identities,
    intact_saves,
    key,
    terminated,
)


def ops(*lines: tuple[str, str, int]) -> list[Operation]:
    numbering = Numbering()
    parsed = [numbering.parse(f"{op}\tmain\t{path}\t", steps) for op, path, steps in lines]
    return [o for o in parsed if o is not None]


def atomic_save(step: int) -> list[tuple[str, str, int]]:
    return [
        ("truncate-open", "ckpt.tmp", step),
        ("write", "ckpt.tmp", step),
        ("fsync", "ckpt.tmp", step),
        ("close", "ckpt.tmp", step),
    ]


def test_an_interposer_line_is_numbered_per_process() -> None:
    numbering = Numbering()
    first = numbering.parse("rename\t1\ta.tmp\ta\n", 4)
    assert first == Operation("1", "rename", "a.tmp", "a", 0, 4)
    assert numbering.parse("mkdir\t0\tstep-4\t\n", 4) == Operation("0", "mkdir", "step-4", "", 0, 4)
    assert numbering.parse("unlink\t1\tb\t\n", 4) == Operation("1", "unlink", "b", "", 1, 4)
    assert numbering.parse("chmod\t1\tb\t\n", 4) is None


def test_every_rename_and_each_save_start_are_chosen_within_any_budget() -> None:
    operations = ops(*atomic_save(2), ("write", "log", 2), *atomic_save(4))
    operations += [Operation("main", "rename", "ckpt.tmp", "ckpt", 99, 4)]
    picked = chosen(operations, budget=1)
    assert [o.op for o in picked] == ["truncate-open", "rename"]
    assert all(o.op != "fsync" for o in chosen(operations, budget=100))
    assert len(chosen(operations, budget=100)) == len(operations) - 2  # both fsyncs


def test_the_choice_is_the_same_for_the_same_operations() -> None:
    operations = ops(*[("write", "big", 1)] * 50)
    assert [key(o) for o in chosen(operations, 7)] == [key(o) for o in chosen(operations, 7)]
    assert len(chosen(operations, 7)) == 7


def test_a_save_is_whole_once_training_went_on_and_nothing_touched_it() -> None:
    operations = ops(
        ("truncate-open", "a.pt", 2),
        ("write", "a.pt", 2),
        ("close", "a.pt", 2),
        ("truncate-open", "a.pt", 4),  # overwritten in place
        ("write", "a.pt", 4),
    )
    assert intact_saves(operations, operations[3]) == [2]
    assert intact_saves(operations, operations[4]) == []  # the open truncated it


def test_a_directory_renamed_into_place_stays_whole_under_its_new_name() -> None:
    operations = ops(
        ("mkdir", "tmp", 2),
        ("truncate-open", "tmp/x", 2),
        ("close", "tmp/x", 2),
        ("mkdir", "tmp", 4),
    )
    rename = Operation("main", "rename", "tmp", "step-2", 99, 2)
    operations = [*operations[:3], rename, operations[3]]
    assert intact_saves(operations, operations[4]) == [2]


def test_sigterm_points_are_save_starts_and_middles_within_their_budget() -> None:
    operations = ops(
        ("write", "log", 0), *atomic_save(2), *atomic_save(4), *atomic_save(6), *atomic_save(8)
    )
    every = terminated(operations, 99)
    # Saves after the first: where each begins and its middle (the fsync is heard, never a
    # point: the middle of what remains is the write).
    assert [(o.op, o.steps_before) for o in every] == [
        (op, step) for step in (2, 4, 6, 8) for op in ("truncate-open", "write")
    ]
    three = terminated(operations, 3)
    assert [(o.op, o.steps_before) for o in three] == [
        ("truncate-open", 2),
        ("truncate-open", 6),
        ("write", 8),
    ]
    assert terminated(operations, 1) == [every[-1]]  # the last save's, always
    assert terminated(operations, 0) == []


def test_an_operation_is_found_again_by_what_it_did_not_its_number() -> None:
    """Which rank makes a shared parent directory is a race: the one that does has one more
    operation, and every later number shifts; what the operation did, and how often before,
    does not."""
    first = Numbering()
    won = [first.parse(line, 2) for line in ("mkdir\t0\tckpt\t", "mkdir\t0\tckpt/step-2\t")]
    second = Numbering()
    lost = [second.parse("mkdir\t0\tckpt/step-2\t", 2)]
    assert won[1] is not None and lost[0] is not None and won[1].index != lost[0].index
    assert identities(o for o in won if o)[1] == identities(o for o in lost if o)[0]
    twice = ops(("write", "ckpt.pt", 2), ("write", "ckpt.pt", 2))
    assert identities(twice) == [
        ("main", "write", "ckpt.pt", "", 0),
        ("main", "write", "ckpt.pt", "", 1),
    ]


def test_a_randomly_named_temporary_file_is_found_again_by_its_shape() -> None:
    first = ops(("truncate-open", ".tmpAb12Cd", 2), ("write", ".tmpAb12Cd", 2))
    again = ops(("truncate-open", ".tmpZz99Yy", 2), ("write", ".tmpZz99Yy", 2))
    assert identities(first) == identities(again)
    assert identities(ops(("write", "ckpt.pt.tmp", 2)))[0][2] == "ckpt.pt.tmp"  # a fixed name
