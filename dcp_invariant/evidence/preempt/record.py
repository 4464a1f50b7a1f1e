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
from dcp_invariant.evidence.preempt.operations import HOWS, OPS, Operation, Point, key

PREEMPT_FILE = "preempt.json"
SCHEMA_VERSION = 2
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
_point = {"how": checks.one_of(*HOWS), "rank": checks.string, "index": checks.integer(0)}
_relaunch = checks.record(
    **_point,
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
    sigterm_points=checks.integer(0),
    grace=checks.pattern(_TIMEOUT, "seconds"),
    reference=checks.json_object,
    operations=checks.list_of(_operation, _MAX_ITEMS),
    relaunches=checks.list_of(_relaunch, _MAX_ITEMS),
    varied=checks.list_of(checks.record(**_point), _MAX_ITEMS),
)


def command_digest(command: Sequence[str]) -> str:
    return hashlib.sha256("\0".join(command).encode("utf-8", "surrogateescape")).hexdigest()


def build(
    command: Sequence[str],
    step_line: str,
    final: str | None,
    crash_points: int,
    timeout: float,
    sigterm_points: int,
    grace: float,
    reference: Mapping[int, list[str]],
    operations: Sequence[Operation],
    relaunches: Mapping[Point, verdict.Relaunch],
    reasons: Mapping[Point, list[str]],
    varied: Sequence[Point],
) -> dict[str, Any]:
    """The record, every list in the order the job made its operations (a SIGKILL point
    before the SIGTERM point at the same operation)."""
    position = {key(o): i for i, o in enumerate(operations)}

    def order(point: Point) -> tuple[int, int]:
        return position[point[1:]], HOWS.index(point[0])

    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "preempt",
        "command": {"arguments": len(command), "digest": command_digest(command)},
        "step_line": step_line,
        "final": final,
        "crash_points": crash_points,
        "timeout": f"{timeout:g}",
        "sigterm_points": sigterm_points,
        "grace": f"{grace:g}",
        "reference": _steps(reference),
        "operations": [o.record() for o in operations],
        "relaunches": [
            {
                **_named(point),
                "exit_code": relaunch["exit_code"],
                "steps": _steps(relaunch["steps"]),
                "final": relaunch["final"],
                "reasons": reasons.get(point, []),
            }
            for point, relaunch in sorted(relaunches.items(), key=lambda kv: order(kv[0]))
        ],
        "varied": [_named(p) for p in sorted(varied, key=order)],
    }


def _named(point: Point) -> dict[str, object]:
    return {"how": point[0], "rank": point[1], "index": point[2]}


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
            (r["how"], r["rank"], r["index"]): verdict.Relaunch(
                exit_code=r["exit_code"], steps=_step_map(r["steps"]), final=r["final"]
            )
            for r in record["relaunches"]
        }
    except (TypeError, ValueError) as exc:
        return [f"{PREEMPT_FILE}: {exc}"]
    derived = verdict.judged(
        operations,
        relaunches,
        reference,
        float(record["timeout"]),
        float(record["grace"]),
        final_compared=record["final"] is not None,
    )
    out = []
    for r in record["relaunches"]:
        point = (r["how"], r["rank"], r["index"])
        named = f"{PREEMPT_FILE}: {r['how']} point rank {r['rank']} operation {r['index']}"
        if point not in derived:
            out.append(f"{named} is no operation")
        elif derived[point] != r["reasons"]:
            out.append(f"{named}: the recorded reasons are not those its relaunch gives")
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
        f"FAIL  {r['how']} rank {r['rank']} operation {r['index']}: {reason}"
        for r in failed
        for reason in r["reasons"]
    ]
    passed = len(record["relaunches"]) - len(failed)
    lines.append(
        f"{'fail' if failed else 'pass'}: {passed} crash points passed, {len(failed)} failed"
    )
    return True, lines
