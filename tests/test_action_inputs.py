"""The composite action's inputs checked before anything is installed
(dcp_invariant/action_inputs.py); the action's own steps run them in tests/test_action_steps.py."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from dcp_invariant import action_inputs, cli
from dcp_invariant.errors import ActionInputError

SHA = "0123456789abcdef0123456789abcdef01234567"


def check(inputs: dict[str, str]) -> action_inputs.Checked:
    return action_inputs.check(inputs, cli.run_plan_of)


DEFAULTS = {
    "torch-version": "2.13.0",
    "environment": "action",
    "output-dir": "evidence",
    "artifact-name": "",
    "source-revision": SHA,
    "upload": "true",
    "run-suite": "true",
    "attest": "false",
    "retention-days": "",
}


@pytest.fixture(autouse=True)
def _in_an_empty_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # output-dir is read relative to the step's directory


def test_the_registered_suites_inputs_give_runs_arguments() -> None:
    checked = check(DEFAULTS)
    assert checked.run_arguments == ("--output-dir", "evidence", "--source-revision", SHA)
    assert checked.outputs() == {
        "environment": "action",
        "run-suite": "true",
        "preempt": "false",
        "upload": "true",
        "attest": "false",
        "evidence-file": "manifest.sha256",
    }


def test_fixture_inputs_become_one_argument_each_in_runs_order() -> None:
    checked = check(
        {
            **DEFAULTS,
            "fixture": "my_project.checks:make_app",
            "world-sizes": "1,2",
            "steps-before": "4",
            "fixture-args": "width=64\r\n\nname=a b\n",
            "rank-local": " data, loader ,",
            "ignore-attr": "app.ema",
        }
    )
    assert checked.run_arguments[4:] == (
        "--fixture", "my_project.checks:make_app", "--world-sizes", "1,2", "--steps-before",
        "4", "--fixture-arg", "width=64", "--fixture-arg", "name=a b", "--rank-local", "data",
        "--rank-local", "loader", "--ignore-attr", "app.ema",
    )  # fmt: skip


def test_resume_with_torch_names_its_scenarios_after_the_torch_the_action_installs() -> None:
    """The input check runs before torch is installed: the plan's installed release is the
    torch-version input, not whatever this interpreter has."""
    checked = check(
        {
            **DEFAULTS,
            "torch-version": "2.14.1",
            "fixture": "my_project.checks:make_app",
            "resume-with-torch": "2.15.0, 2.13.0",
        }
    )
    arguments = list(checked.run_arguments)
    assert arguments[-4:] == ["--resume-with-torch", "2.15.0", "--resume-with-torch", "2.13.0"]
    names = cli.run_plan_of(["run", *arguments], "2.14.1").names
    assert "upgrade_2.14.1_to_2.15.0_1" in names and "downgrade_2.14.1_to_2.13.0_2" in names


def test_booleans_and_the_environment_are_read_case_insensitively() -> None:
    checked = check({**DEFAULTS, "run-suite": "TRUE", "upload": "False", "environment": "Caller"})
    assert checked.outputs() == {
        "environment": "caller",
        "run-suite": "true",
        "preempt": "false",
        "upload": "false",
        "attest": "false",
        "evidence-file": "manifest.sha256",
    }


def test_verifying_only_checks_no_suite_input(tmp_path: Path) -> None:
    """With run-suite 'false' the artifact is already in output-dir, and no run is made."""
    (tmp_path / "evidence").mkdir()
    (tmp_path / "evidence" / "summary.json").write_text("{}", encoding="utf-8")
    checked = check({**DEFAULTS, "run-suite": "false"})
    assert checked.run_arguments == ()
    with pytest.raises(ActionInputError, match=r"^input output-dir 'evidence': "):
        check(DEFAULTS)


@pytest.mark.parametrize(
    ("name", "value"),
    [("output-dir", ""), ("output-dir", "a\nb"), ("retention-days", "0"), ("retention-days", "Ⅸ")],
)
def test_a_bad_value_names_its_input(name: str, value: str) -> None:
    with pytest.raises(ActionInputError, match=f"^input {name} "):
        check({**DEFAULTS, name: value})


def test_each_input_is_held_to_runs_grammar() -> None:
    """run's own bounds (steps 1 to 1000), named by the input that broke them."""
    checked = check({**DEFAULTS, "fixture": "m:f", "world-sizes": "2", "steps-after": "1000"})
    assert "--world-sizes" in checked.run_arguments
    with pytest.raises(ActionInputError, match=r"^input steps-after '1001': "):
        check({**DEFAULTS, "fixture": "m:f", "steps-after": "1001"})


def test_a_line_break_in_an_argument_is_refused() -> None:
    """Each argument is one line of the file the suite step reads: "3\\n" would be two."""
    with pytest.raises(ActionInputError, match=r"^input steps-before '3\\n': give it on one line$"):
        check({**DEFAULTS, "fixture": "m:f", "steps-before": "3\n"})


@pytest.mark.parametrize("where", [{"run-suite": "false"}, {"environment": "caller"}])
def test_torch_version_is_checked_only_where_it_is_installed(where: dict[str, str]) -> None:
    with pytest.raises(ActionInputError, match=r"^input torch-version '2\.13' "):
        check({**DEFAULTS, "torch-version": "2.13"})
    if where.get("run-suite") == "false":
        (Path("evidence")).mkdir()  # verifying only: the artifact is already there
    check({**DEFAULTS, "torch-version": "2.13", **where})


def test_a_retention_above_githubs_limit_is_left_to_the_upload() -> None:
    """actions/upload-artifact lowers it to the repository's limit, with a warning."""
    check({**DEFAULTS, "retention-days": "400"})


# --- preempt-command: the caller's own job, instead of the suite ------------------------------


@pytest.fixture
def linux_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    """The input check runs on the runner, and refuses preempt off Linux (tested last)."""
    monkeypatch.setattr(sys, "platform", "linux")


# What a shell would run, a glob and a variable: each stays in its argument, as it is.
HOSTILE = (
    "python train.py --out {run_dir} --name 'a b; $(touch pwned)' \"`touch pwned`\" "
    '; touch pwned | cat > pwned && $HOME * --tag="it\'s"'
)


@pytest.mark.usefixtures("linux_runner")
def test_preempt_command_is_split_as_a_shell_splits_words_and_never_run_by_one() -> None:
    checked = check({**DEFAULTS, "preempt-command": HOSTILE})
    assert checked.preempt_arguments == (
        "--output-dir=evidence", "--", "python", "train.py", "--out", "{run_dir}", "--name",
        "a b; $(touch pwned)", "`touch pwned`", ";", "touch", "pwned", "|", "cat", ">", "pwned",
        "&&", "$HOME", "*", "--tag=it's",
    )  # fmt: skip
    assert checked.preempt_arguments[2:] == tuple(shlex.split(HOSTILE))
    # The check step runs (and torch is installed), with preempt's arguments, not the suite's.
    assert checked.arguments == checked.preempt_arguments and checked.run_arguments == ()
    assert checked.outputs() == {
        "environment": "action",
        "run-suite": "true",
        "preempt": "true",
        "upload": "true",
        "attest": "false",
        "evidence-file": "preempt.json",
    }
    assert not Path("pwned").exists()


@pytest.mark.usefixtures("linux_runner")
def test_preempt_options_become_one_flag_each_and_empty_ones_none() -> None:
    step_line = r"-?it (?P<step>\d+) loss=(?P<loss>\S+)"  # a leading "-" stays its value
    checked = check(
        {
            **DEFAULTS,
            "preempt-command": "torchrun --nproc-per-node 2 train.py {run_dir}",
            "preempt-final": "final/model.safetensors",
            "preempt-step-line": step_line,
            "preempt-crash-points": "8",
        }
    )
    assert checked.preempt_arguments == (
        "--output-dir=evidence", "--final=final/model.safetensors", f"--step-line={step_line}",
        "--crash-points=8", "--", "torchrun", "--nproc-per-node", "2", "train.py", "{run_dir}",
    )  # fmt: skip
    # preempt's own parser takes them back as given (its program lookup runs in the step).
    parsed = cli.build_parser().parse_args(["preempt", *checked.preempt_arguments])
    assert (parsed.final, parsed.step_line, parsed.crash_points) == (
        "final/model.safetensors",
        step_line,
        8,
    )
    assert parsed.job[1:] == ["torchrun", "--nproc-per-node", "2", "train.py", "{run_dir}"]


def test_a_blank_preempt_command_runs_the_suite() -> None:
    """A matrix may leave it empty, or a YAML block scalar leave a line break, for some jobs."""
    checked = check({**DEFAULTS, "preempt-command": " \n"})
    assert not checked.preempt and checked.run_suite
    assert (
        checked.arguments
        == checked.run_arguments
        == ("--output-dir", "evidence", "--source-revision", SHA)
    )


@pytest.mark.parametrize(
    ("inputs", "line"),
    [
        (
            {"preempt-command": "python train.py '{run_dir}"},
            'input preempt-command "python train.py \'{run_dir}": no closing quotation: it is '
            "split as a shell splits words (shlex), and never given to one",
        ),
        (
            {"preempt-command": "python train.py --out runs"},
            "input preempt-command 'python train.py --out runs' has no {run_dir}: put it where "
            "the job takes the directory it writes its checkpoints to (e.g. --output-dir "
            "{run_dir})",
        ),
        (
            {"preempt-command": "python -c 'import x\nx.run()' {run_dir}"},
            "input preempt-command: the argument 'import x\\nx.run()' holds a line break: put "
            "what it runs in a script of your checkout and give its path",
        ),
        (
            {"preempt-command": "python t.py {run_dir}", "fixture": "m:f"},
            "input fixture 'm:f' goes with the suite, and preempt-command runs your own job "
            "instead: give one of them (use the action twice for both)",
        ),
        (
            {"preempt-command": "python t.py {run_dir}", "world-sizes": "1,2"},
            "input world-sizes '1,2' goes with the suite",
        ),
        (
            {"preempt-command": "python t.py {run_dir}", "run-suite": "false"},
            "input run-suite 'false' only verifies output-dir, and preempt-command runs a check: "
            "leave run-suite 'true' or preempt-command empty",
        ),
        (
            {"preempt-final": "final.pt"},
            "input preempt-final 'final.pt' goes with preempt-command, which is empty",
        ),
        (
            {"preempt-command": "python t.py {run_dir}", "preempt-final": "../final.pt"},
            "input preempt-final '../final.pt': --final '../final.pt' is not a path inside "
            "{run_dir}",
        ),
        (
            {"preempt-command": "python t.py {run_dir}", "preempt-step-line": "step (\\d+)"},
            "input preempt-step-line 'step (\\\\d+)': --step-line 'step (\\\\d+)' has no named "
            "group step or loss",
        ),
        (
            {"preempt-command": "python t.py {run_dir}", "preempt-crash-points": "many"},
            "input preempt-crash-points 'many': give a whole number, 1 or more, or leave it "
            "empty for preempt's default, 32",
        ),
        (
            {"preempt-command": "python t.py {run_dir}", "preempt-crash-points": "0"},
            "input preempt-crash-points '0': --crash-points 0: give a positive number",
        ),
        (
            {"preempt-command": "python t.py {run_dir}", "preempt-final": "final.pt\n"},
            "input preempt-final 'final.pt\\n': give it on one line",
        ),
    ],
)
@pytest.mark.usefixtures("linux_runner")
def test_a_bad_preempt_input_names_its_input(inputs: dict[str, str], line: str) -> None:
    with pytest.raises(ActionInputError) as caught:
        check({**DEFAULTS, **inputs})
    assert str(caught.value).startswith(line), str(caught.value)
    assert len(str(caught.value).splitlines()) == 1


@pytest.mark.usefixtures("linux_runner")
def test_preempts_output_dir_must_be_new_or_empty(tmp_path: Path) -> None:
    (tmp_path / "evidence").mkdir()
    check({**DEFAULTS, "preempt-command": "python t.py {run_dir}"})  # empty: fine
    (tmp_path / "evidence" / "preempt.json").write_text("{}", encoding="utf-8")
    with pytest.raises(ActionInputError, match=r"^input output-dir 'evidence': --output-dir "):
        check({**DEFAULTS, "preempt-command": "python t.py {run_dir}"})


def test_preempt_is_refused_before_anything_is_installed_off_linux(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    with pytest.raises(ActionInputError, match=r"^input preempt-command: preempt runs on Linux "):
        check({**DEFAULTS, "preempt-command": "python t.py {run_dir}"})
