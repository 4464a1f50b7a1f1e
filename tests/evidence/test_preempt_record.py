"""preempt's record: canonical, holding no path, and re-derived by verify without torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dcp_invariant import canonical, cli
from dcp_invariant.evidence.preempt import record, verdict
from dcp_invariant.evidence.preempt.operations import Numbering, Operation, Point

REFERENCE = {1: ["a"], 2: ["b"], 3: ["c"], 4: ["d"]}
COMMAND = ["/home/someone/venv/bin/python", "train.py", "--out", "{run_dir}"]


def operations() -> list[Operation]:
    numbering = Numbering()
    lines = [("truncate-open", "ckpt.pt", 2), ("write", "ckpt.pt", 2), ("close", "ckpt.pt", 2)]
    lines += [("truncate-open", "ckpt.pt", 4), ("write", "ckpt.pt", 4)]
    made = [numbering.parse(f"{op}\tmain\t{path}\t", s) for op, path, s in lines]
    return [o for o in made if o is not None]


def a_record() -> dict[str, Any]:
    ops = operations()
    relaunches: dict[Point, verdict.Relaunch] = {
        ("kill", "main", 1): {"exit_code": 1, "steps": {}, "final": None},
        ("kill", "main", 3): {"exit_code": 0, "steps": {3: ["c"], 4: ["d"]}, "final": None},
        ("kill", "main", 4): {
            "exit_code": 0,
            "steps": dict(REFERENCE),
            "final": "final.pt: differs",
        },
        ("term", "main", 3): {"exit_code": 0, "steps": {3: ["c"], 4: ["d"]}, "final": None},
    }
    reasons = verdict.judged(ops, relaunches, REFERENCE, 60.0, 30.0)
    built = record.build(
        COMMAND, "step", "final.pt", 8, 60.0, 3, 30.0, REFERENCE, ops, relaunches, reasons, []
    )
    loaded: dict[str, Any] = canonical.loads(canonical.dumps(built))
    return loaded


def test_a_record_verifies_and_names_no_path() -> None:
    made = a_record()
    assert record.problems(made) == []
    assert "/home/someone" not in json.dumps(made)
    assert made["command"]["arguments"] == 4
    assert [(r["how"], r["reasons"] != []) for r in made["relaunches"]] == [
        ("kill", True),
        ("kill", False),
        ("term", False),
        ("kill", True),
    ]


@pytest.mark.parametrize(
    "tamper",
    [
        lambda r: r["relaunches"][0].update(reasons=[]),
        lambda r: r["relaunches"][1].update(exit_code=1),
        lambda r: r["relaunches"][3].update(final=None),
        lambda r: r["reference"].update({"4": ["x"]}),
        lambda r: r["relaunches"][0].update(index=99),
        lambda r: r["relaunches"][2].update(how="stop"),
        lambda r: r["relaunches"][2].update(exit_code=1),
    ],
    ids=[
        "reasons dropped",
        "exit code",
        "final",
        "reference",
        "no such operation",
        "no such signal",
        "SIGTERM exit code",
    ],
)
def test_a_record_whose_verdicts_do_not_follow_is_refused(tamper: Any) -> None:
    made = a_record()
    tamper(made)
    assert record.problems(made) != []


def test_verify_derives_a_preempt_record_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record.write(tmp_path, a_record())
    assert cli.main(["verify", str(tmp_path)]) == 1  # valid, and two points failed
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "fail: 2 crash points passed, 2 failed"
    made = a_record()
    made["relaunches"][0]["reasons"] = []
    (tmp_path / record.PREEMPT_FILE).write_bytes(canonical.dumps(made))
    assert cli.main(["verify", str(tmp_path)]) == 1
    assert "invalid: preempt.json: kill point rank main operation 1" in capsys.readouterr().out
