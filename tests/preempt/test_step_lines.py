"""The step lines preempt compares: found in common forms, kept as printed, compared in order."""

from __future__ import annotations

import pytest

from dcp_invariant.errors import PreemptInputError
from dcp_invariant.evidence.preempt import step_lines

DEFAULT = step_lines.compiled(step_lines.DEFAULT_STEP_LINE)


@pytest.mark.parametrize(
    ("line", "step", "loss"),
    [
        ("step 3 loss 0.25", 3, "0.25"),
        ("\x1b[31mstep:  3  \x1b[32mloss:  0.2500\x1b[39m  memory: 1GiB", 3, "0.2500"),
        ("step=12 lr=0.1 loss=0x1.8p-2", 12, "0x1.8p-2"),
        ("[rank1] step 4 | loss nan", 4, "nan"),
        ("step 5 loss 1e-05 grad_norm 2", 5, "1e-05"),
    ],
)
def test_the_default_finds_common_forms(line: str, step: int, loss: str) -> None:
    assert step_lines.steps([line], DEFAULT) == {step: [loss]}


def test_lines_that_are_not_step_lines_are_left_out() -> None:
    lines = ["loading checkpoint step-4", "epoch 1 loss 0.3", "steps: 4"]
    assert step_lines.steps(lines, DEFAULT) == {}


def test_losses_printed_by_several_ranks_are_kept_in_order() -> None:
    found = step_lines.steps(["step 1 loss 0.5", "step 1 loss 0.25", "step 2 loss 0.1"], DEFAULT)
    assert found == {1: ["0.25", "0.5"], 2: ["0.1"]}


def test_a_difference_names_the_first_step_and_both_losses() -> None:
    expected = {1: ["0.5"], 2: ["0.25"], 3: ["0.125"]}
    assert step_lines.first_difference(expected, {2: ["0.25"], 3: ["0.125"]}) is None
    assert step_lines.first_difference(expected, {2: ["0.26"], 3: ["0.1"]}) == (
        "step 2: loss 0.26, the uninterrupted run 0.25"
    )
    assert step_lines.first_difference(expected, {2: ["0.25"]}) == (
        "it stopped after step 2; the uninterrupted run reached step 3"
    )
    assert "never reached" in str(step_lines.first_difference(expected, {4: ["0.1"]}))


@pytest.mark.parametrize(
    ("pattern", "said"),
    [("step (", "is not a regular expression"), (r"step (?P<step>\d+)", "no named group loss")],
)
def test_a_bad_step_line_is_refused_in_one_line(pattern: str, said: str) -> None:
    with pytest.raises(PreemptInputError, match=said) as caught:
        step_lines.compiled(pattern)
    assert "\n" not in str(caught.value)
