"""``preempt``'s evidence: one canonical record (``preempt.json``) of what the job did and what
each relaunch did, from which ``verify`` derives every verdict again without torch.

It holds no path, time, PID or host: the command by digest (its arguments may name the user's
directories), crash points by process, operation number and relative path, and each relaunch
by its exit code, step lines and the first difference of its final state.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dcp_invariant import canonical
from dcp_invariant.evidence import checks
from dcp_invariant.evidence.preempt import verdict
from dcp_invariant.evidence.preempt.operations import OPS, Operation, key

PREEMPT_FILE = "preempt.json"
SCHEMA_VERSION = 1
_MAX_ITEMS = 1 << 20
_TIMEOUT = re.compile(r"\d+(\.\d+)?")

_operation = checks.record(
    rank=checks.string,
    op=checks.one_of(*OPS),
    path=checks.string,
    target=checks.string,
    index=checks.integer(0),
    steps_before=checks.integer(0),
)
_relaunch = checks.record(
    rank=checks.string,
    index=checks.integer(0),
    exit_code=checks.optional(checks.integer()),
    steps=checks.json_object,
    final=checks.optional(checks.string),
    reasons=checks.list_of(checks.string, 16),
)
_SHAPE = checks.record(
    schema_version=checks.one_of(SCHEMA_VERSION),
    kind=checks.one_of("preempt"),
    command=checks.record(arguments=checks.integer(1), digest=checks.string),
    step_line=checks.string,
    final=checks.optional(checks.string),
    crash_points=checks.integer(1),
    timeout=checks.pattern(_TIMEOUT, "seconds"),
    reference=checks.json_object,
    operations=checks.list_of(_operation, _MAX_ITEMS),
    relaunches=checks.list_of(_relaunch, _MAX_ITEMS),
    varied=checks.list_of(checks.record(rank=checks.string, index=checks.integer(0)), _MAX_ITEMS),
)


def command_digest(command: Sequence[str]) -> str:
    return hashlib.sha256("\0".join(command).encode("utf-8", "surrogateescape")).hexdigest()


def build(
    command: Sequence[str],
    step_line: str,
    final: str | None,
    crash_points: int,
    timeout: float,
    reference: Mapping[int, list[str]],
    operations: Sequence[Operation],
    relaunches: Mapping[tuple[str, int], verdict.Relaunch],
    reasons: Mapping[tuple[str, int], list[str]],
    varied: Sequence[Operation],
) -> dict[str, Any]:
    """The record, every list in the order the job made its operations."""
    position = {key(o): i for i, o in enumerate(operations)}
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "preempt",
        "command": {"arguments": len(command), "digest": command_digest(command)},
        "step_line": step_line,
        "final": final,
        "crash_points": crash_points,
        "timeout": f"{timeout:g}",
        "reference": _steps(reference),
        "operations": [o.record() for o in operations],
        "relaunches": [
            {
                "rank": point[0],
                "index": point[1],
                "exit_code": relaunch["exit_code"],
                "steps": _steps(relaunch["steps"]),
                "final": relaunch["final"],
                "reasons": reasons.get(point, []),
            }
            for point, relaunch in sorted(relaunches.items(), key=lambda kv: position[kv[0]])
        ],
        "varied": [{"rank": o.rank, "index": o.index} for o in varied],
    }


def _steps(steps: Mapping[int, list[str]]) -> dict[str, list[str]]:
    return {str(step): losses for step, losses in sorted(steps.items())}


def write(directory: Path, record: Mapping[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / PREEMPT_FILE).write_bytes(canonical.dumps(dict(record)))


def problems(record: Any) -> list[str]:
    """Why ``record`` is not a preempt record whose verdicts follow from what it holds."""
    found = _SHAPE(record, PREEMPT_FILE)
    if found:
        return found
    try:
        operations = [Operation(**o) for o in record["operations"]]
        reference = _step_map(record["reference"])
        relaunches = {
            (r["rank"], r["index"]): verdict.Relaunch(
                exit_code=r["exit_code"], steps=_step_map(r["steps"]), final=r["final"]
            )
            for r in record["relaunches"]
        }
    except (TypeError, ValueError) as exc:
        return [f"{PREEMPT_FILE}: {exc}"]
    derived = verdict.judged(operations, relaunches, reference, float(record["timeout"]))
    out = []
    for r in record["relaunches"]:
        point = (r["rank"], r["index"])
        if point not in derived:
            out.append(f"{PREEMPT_FILE}: rank {point[0]} operation {point[1]} is no operation")
        elif derived[point] != r["reasons"]:
            out.append(
                f"{PREEMPT_FILE}: rank {point[0]} operation {point[1]}: the recorded reasons are "
                "not those its relaunch gives"
            )
    return out


def _step_map(value: Any) -> dict[int, list[str]]:
    """``{"3": ["0x1p-2"]}`` back to ``{3: [...]}``: ValueError for any other shape."""
    if not isinstance(value, dict):
        raise ValueError("steps: not an object")
    out = {}
    for step, losses in value.items():
        if not step.isdigit() or not isinstance(losses, list):
            raise ValueError(f"steps: {step!r} is not a step with its losses")
        if not all(isinstance(loss, str) for loss in losses):
            raise ValueError(f"steps: step {step}'s losses are not text")
        out[int(step)] = losses
    return out


def verify(directory: Path) -> tuple[bool, list[str]]:
    """Whether ``directory``'s record stands, and the lines to print: each crash point's verdict
    as derived again, or each problem."""
    try:
        record = canonical.loads((directory / PREEMPT_FILE).read_bytes(), what=PREEMPT_FILE)
    except (OSError, ValueError) as exc:
        return False, [f"invalid: {PREEMPT_FILE}: {exc}"]
    found = problems(record)
    if found:
        return False, [f"invalid: {p}" for p in found]
    failed = [r for r in record["relaunches"] if r["reasons"]]
    lines = [
        f"FAIL  rank {r['rank']} operation {r['index']}: {reason}"
        for r in failed
        for reason in r["reasons"]
    ]
    passed = len(record["relaunches"]) - len(failed)
    lines.append(
        f"{'fail' if failed else 'pass'}: {passed} crash points passed, {len(failed)} failed"
    )
    return True, lines
