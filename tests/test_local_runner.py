"""The local runner's own logic (tests/local_runner.py): expressions, command files, matrices.

The runner must read the workflow as GitHub does, and refuse what it does not model rather
than approve it; these tests hold it to both without running a job.
"""

from __future__ import annotations

import pytest
from local_runner import (
    Job,
    JobResult,
    Scope,
    StepResult,
    UnsupportedWorkflow,
    coverage,
    expand,
    parse_command_file,
)

SHA = "0123456789abcdef0123456789abcdef01234567"


def scope(failed: bool = False) -> Scope:
    s = Scope(
        {
            "inputs": {"upload": "true", "retention-days": ""},
            "github": {"sha": SHA},
            "runner": {"os": "Linux"},
        },
        failed=failed,
    )
    s.steps["install"] = StepResult("install", "success", "success", {"verdict": "fail"})
    s.steps["tampered"] = StepResult("tampered", "failure", "success", {"verdict": "fail"})
    return s


@pytest.mark.parametrize(
    ("condition", "failed", "expected"),
    [
        ("", False, True),  # no if: is success()
        ("", True, False),
        ("inputs.upload == 'true'", False, True),
        ("inputs.upload == 'TRUE'", False, True),  # strings compare ignoring case
        ("inputs.upload == 'true'", True, False),  # the implicit success()
        ("${{ !cancelled() && inputs.upload == 'true' }}", True, True),
        ("always()", True, True),
        ("failure()", True, True),
        ("failure()", False, False),
        ("inputs.retention-days != ''", False, False),
        ("steps.install.outcome == 'success'", False, True),
        ("runner.os == 'Windows'", False, False),
        # continue-on-error: the outcome is failure, the conclusion success.
        (
            "steps.tampered.outcome != 'failure' || steps.tampered.outputs.verdict != 'fail'",
            False,
            False,
        ),
        ("steps.tampered.conclusion == 'success'", False, True),
        ("steps.install.outputs.absent == ''", False, True),  # an unset output is ''
        ("!(inputs.upload == 'true' && runner.os == 'Linux')", False, False),
        ("inputs.upload && inputs.retention-days", False, False),  # '' is falsy
    ],
)
def test_conditions_evaluate_as_github_does(condition: str, failed: bool, expected: bool) -> None:
    assert scope(failed).condition(condition) is expected


@pytest.mark.parametrize(
    "condition",
    [
        "github.event_name == 'push'",
        "steps.nope.outcome == 'x'",
        "inputs.nope == 'x'",
        "secrets.TOKEN != ''",
        "inputs.upload == 'true' &&",
        "(inputs.upload == 'true'",
        "contains(inputs.upload, 'x')",
        "inputs.upload == true",  # a string compared with a boolean: coercion is not modelled
    ],
)
def test_what_it_does_not_model_is_refused(condition: str) -> None:
    with pytest.raises(UnsupportedWorkflow):
        scope().condition(condition)


def test_substitution() -> None:
    s = scope()
    assert s.substitute("${{ inputs.upload }}-${{ github.sha }}") == f"true-{SHA}"
    assert s.substitute("${{ steps.install.outcome == 'success' }}") == "true"
    assert s.substitute(True) == "true"
    for text in ("${{ github.token }}", "${{ secrets.X }}", "${{ inputs.nope }}"):
        with pytest.raises(UnsupportedWorkflow):
            s.substitute(text)


def test_command_files_hold_lines_and_delimited_blocks() -> None:
    text = "a=1\nb<<EOF\nx=y\nz\nEOF\nc=\n"
    assert parse_command_file(text) == {"a": "1", "b": "x=y\nz", "c": ""}
    with pytest.raises(AssertionError, match="no closing"):
        parse_command_file("b<<EOF\nnever closed\n")


WORKFLOW = {
    "jobs": {
        "quality": {
            "name": "quality (${{ matrix.os }}, ${{ matrix.python }})",
            "runs-on": "${{ matrix.os }}",
            "strategy": {"matrix": {"os": ["ubuntu-latest", "windows-latest"], "python": [3.11]}},
            "steps": [
                {"run": "echo ${{ matrix.python }}", "shell": "bash"},
                {"if": "runner.os == 'Windows'", "run": "echo windows", "shell": "bash"},
            ],
        },
        "one": {"runs-on": "ubuntu-latest", "steps": [{"run": "true", "shell": "bash"}]},
    }
}


def test_a_matrix_expands_to_one_job_per_combination() -> None:
    jobs = expand(WORKFLOW)
    assert [(j.name, j.runs_on, j.on_linux) for j in jobs] == [
        ("quality (ubuntu-latest, 3.11)", "ubuntu-latest", True),
        ("quality (windows-latest, 3.11)", "windows-latest", False),
        ("one", "ubuntu-latest", True),
    ]
    assert jobs[1].matrix == {"os": "windows-latest", "python": "3.11"}
    with pytest.raises(UnsupportedWorkflow, match="include/exclude"):
        expand({"jobs": {"x": {"runs-on": "u", "strategy": {"matrix": {"include": []}}}}})


def test_a_job_on_another_os_says_which_steps_a_linux_job_ran_for_it() -> None:
    jobs = expand(WORKFLOW)
    ran = [JobResult(j.name, j.runs_on) for j in jobs]
    assert coverage(jobs[1], ran, jobs) == (
        "needs windows-latest; 1 of its steps ran as written in the Linux job; "
        "not run here: echo windows"
    )
    # A Linux job that failed covers nothing.
    failed = [
        JobResult(j.name, j.runs_on, steps=[StepResult("s", "failure", "failure")]) for j in jobs
    ]
    assert "0 of its steps" in coverage(jobs[1], failed, jobs)


def test_a_job_is_linux_only_on_ubuntu_runners() -> None:
    assert Job("k", "n", "ubuntu-24.04", {}, {}).os_name == "Linux"
    assert Job("k", "n", "macos-latest", {}, {}).os_name == "macOS"
    assert not Job("k", "n", "macos-latest", {}, {}).on_linux
