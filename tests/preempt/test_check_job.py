"""``dcp_invariant.check_job``: preempt from Python; its bad input raises before any launch."""

from __future__ import annotations

from typing import Any

import pytest

import dcp_invariant


@pytest.mark.parametrize(
    ("command", "options", "said"),
    [
        ("python train.py", {}, "the command has no {run_dir}"),
        (["python", "{run_dir}"], {"crash_points": "8"}, "crash_points must be an int"),
        (["python", "{run_dir}"], {"timeout": "1"}, "timeout must be a number of seconds"),
        ("python '{run_dir}' --x", {"final": "../f"}, "is not a path inside {run_dir}"),
        ('python "a {run_dir}', {}, "No closing quotation: close its quotes"),
        (["python", "{run_dir}"], {"sigterm_points": -1}, "--sigterm-points -1: give 0 or more"),
        (["python", "{run_dir}"], {"grace": "5"}, "grace must be a number of seconds"),
    ],
)
def test_bad_input_raises_bad_input(command: Any, options: dict[str, Any], said: str) -> None:
    with pytest.raises(dcp_invariant.BadInput, match=said.replace("{", r"\{").replace("}", r"\}")):
        dcp_invariant.check_job(command, **options)


def test_the_names_are_the_packages() -> None:
    assert {"check_job", "JobReport", "CrashPoint"} <= set(dcp_invariant.__all__)
    assert dcp_invariant.JobReport.__name__ == "JobReport"
