"""The composite action's inputs checked before anything is installed
(dcp_invariant/action_inputs.py); the action's own steps run them in tests/test_action_steps.py."""

from __future__ import annotations

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
        "upload": "true",
        "attest": "false",
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
        "upload": "false",
        "attest": "false",
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
