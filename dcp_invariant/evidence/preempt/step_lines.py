"""The per-step lines a job prints, as ``preempt`` compares them: step number and loss, as
printed. Pure: the runner feeds it the job's output, the rules read what it returns.

A loss is compared as the text the job printed, never parsed: ``0.25`` and ``0.2500`` differ,
and a job that prints ``float.hex`` or ``repr`` shows every bit (docs/preempt.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from dcp_invariant.errors import PreemptInputError

# `step 3 loss 0.25`, `step: 3 loss: 0.25`, torchtitan's `step:  3  loss:  0.2500`,
# `step=3 ... loss=0.25`: the word step, its number, then later on the line the word loss and
# its value (a decimal, float.hex, inf or nan).
DEFAULT_STEP_LINE = (
    r"\bstep\b\W{0,3}(?P<step>\d+)\b.*?\bloss\b\W{0,3}"
    r"(?P<loss>[-+]?(?:0x[0-9a-fA-F]+(?:\.[0-9a-fA-F]*)?p[-+]?\d+|inf|nan|\d+(?:\.\d*)?(?:[eE][-+]?\d+)?))"
)
# The colour codes a terminal logger adds (torchtitan's): not part of what was printed.
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

# Each step's losses as printed, in order: more than one where several ranks print it.
Steps = dict[int, list[str]]


def compiled(pattern: str) -> re.Pattern[str]:
    """``--step-line``: a regular expression with the named groups ``step`` and ``loss``."""
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise PreemptInputError(
            f"--step-line {pattern!r} is not a regular expression ({exc}): give one with the "
            "named groups (?P<step>...) and (?P<loss>...)"
        ) from None
    missing = [g for g in ("step", "loss") if g not in regex.groupindex]
    if missing:
        raise PreemptInputError(
            f"--step-line {pattern!r} has no named group {' or '.join(missing)}: name the step "
            "number (?P<step>\\d+) and the loss (?P<loss>\\S+)"
        )
    return regex


def steps(lines: Iterable[str], regex: re.Pattern[str]) -> Steps:
    """The step lines among ``lines``: each step's losses, sorted (ranks print in any order)."""
    found: Steps = {}
    for line in lines:
        match = regex.search(_ANSI.sub("", line))
        if match is None:
            continue
        try:
            step = int(match.group("step"))
        except ValueError:
            continue  # a step group that matched no number: not a step line
        found.setdefault(step, []).append(match.group("loss"))
    return {step: sorted(losses) for step, losses in sorted(found.items())}


def first_difference(
    expected: Mapping[int, list[str]], got: Mapping[int, list[str]], past_the_end: bool = True
) -> str | None:
    """Where ``got`` first parts from ``expected``, over the steps ``got`` printed and the last
    one ``expected`` reached; None when every printed step matches and the run got as far.
    Without ``past_the_end``, a step after the last one ``expected`` reached is no difference:
    the caller knows the final state is the same (Hugging Face's Trainer, resumed from its last
    checkpoint, runs one more training_step and leaves the same weights)."""
    last = max(expected, default=0)
    for step in sorted(got):
        if step > last and not past_the_end:
            continue
        if step not in expected:
            return f"step {step} was printed, which the uninterrupted run never reached"
        if got[step] != expected[step]:
            return f"step {step}: loss {_shown(got[step])}, the uninterrupted run {_shown(expected[step])}"
    reached = max(got, default=0)
    if reached < last:
        return f"it stopped after step {reached}; the uninterrupted run reached step {last}"
    return None


def _shown(losses: list[str]) -> str:
    return losses[0] if len(losses) == 1 else "[" + ", ".join(losses) + "]"
