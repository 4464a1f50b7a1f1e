"""``preempt``'s bad input: one line naming the problem and the fix, exit 2, nothing launched."""

from __future__ import annotations

import pytest

from dcp_invariant import cli


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--", "python", "train.py"], "the command has no {run_dir}"),
        ([], "give the job's command after --"),
        (["--", "no-such-program-here", "{run_dir}"], "command not found"),
        (["--final", "/abs", "--", "python", "{run_dir}"], "is not a path inside {run_dir}"),
        (["--final", "../up", "--", "python", "{run_dir}"], "is not a path inside {run_dir}"),
        (["--step-line", "(", "--", "python", "{run_dir}"], "is not a regular expression"),
        (
            ["--step-line", "step (?P<step>\\d+)", "--", "python", "{run_dir}"],
            "no named group loss",
        ),
        (["--crash-points", "0", "--", "python", "{run_dir}"], "give a positive number"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["preempt", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and said in err, err
