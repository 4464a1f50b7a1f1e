"""Resolving ``--fixture MODULE:CALLABLE``: what a module that cannot be imported, or a callable that cannot be called, is told (torch-free).

A worker runs ``load_fixture`` in its scenario's workspace, with the directory ``run`` was started
in first on ``sys.path`` (cli._run puts it there): the tests set both up that way.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dcp_invariant.suite.fixture import FixtureError, load_fixture


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The user's directory, first on sys.path; the working directory is a workspace elsewhere."""
    root = tmp_path / "project"
    workspace = tmp_path / "workspace"
    root.mkdir()
    workspace.mkdir()
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.chdir(workspace)
    return root


def refusal(spec: str) -> str:
    with pytest.raises(FixtureError) as caught:
        load_fixture(spec)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_missing_module_names_the_current_directory(project: Path) -> None:
    assert refusal("dcpi_absent_checks:make_app") == (
        "fixture 'dcpi_absent_checks:make_app': cannot import 'dcpi_absent_checks' (No module "
        f"named 'dcpi_absent_checks') from {project} (the current directory) or PYTHONPATH, nor "
        "is it installed; check the name, run where dcpi_absent_checks is, or install it"
    )


@pytest.mark.parametrize("layout", ["package", "module"])
def test_a_module_under_src_is_told_to_run_with_pythonpath_src(project: Path, layout: str) -> None:
    src = project / "src"
    if layout == "package":
        (src / "dcpi_src_pkg").mkdir(parents=True)
        (src / "dcpi_src_pkg" / "checks.py").write_text("def make_app(rank, world_size): ...\n")
        spec = "dcpi_src_pkg.checks:make_app"
    else:
        src.mkdir()
        (src / "dcpi_src_pkg.py").write_text("def make_app(rank, world_size): ...\n")
        spec = "dcpi_src_pkg:make_app"
    message = refusal(spec)
    assert f"from {project} (the current directory)" in message, message
    assert message.endswith(
        "; dcpi_src_pkg is under src/: run with PYTHONPATH=src (or install the project)"
    ), message


def test_a_fixture_importing_its_project_from_src_is_told_the_same(project: Path) -> None:
    """The common src layout: the fixture lives outside src/ and imports the project's package."""
    (project / "src" / "dcpi_src_project").mkdir(parents=True)
    (project / "dcpi_checks_outside.py").write_text("import dcpi_src_project\n")
    message = refusal("dcpi_checks_outside:make_app")
    assert "ModuleNotFoundError: No module named 'dcpi_src_project'" in message, message
    assert message.endswith(
        "; dcpi_src_project is under src/: run with PYTHONPATH=src (or install the project)"
    ), message


def test_src_already_on_the_path_is_not_suggested_again(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "src" / "dcpi_src_again").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(project / "src"))
    monkeypatch.syspath_prepend(str(project))  # the current directory stays first
    message = refusal("dcpi_src_again.missing:make_app")
    assert "PYTHONPATH=src" not in message, message
    assert message.endswith("check the name, run where dcpi_src_again is, or install it")


@pytest.mark.parametrize(
    ("spec", "arguments", "message"),
    [
        ("os:getcwd", {}, "a fixture takes rank and world_size as its first two parameters"),
        ("re:sub", {}, "pass its other parameters with --fixture-arg NAME=VALUE"),
        ("re:sub", {"nope": 1}, "pass only the --fixture-arg names it takes"),
    ],
)
def test_a_fixture_that_cannot_take_its_arguments_says_which_fix_applies(
    spec: str, arguments: dict[str, object], message: str
) -> None:
    with pytest.raises(FixtureError, match=re.escape(message)):
        load_fixture(spec, arguments)


def test_fixture_arguments_that_complete_the_call_are_accepted() -> None:
    fixture: object = load_fixture("re:sub", {"string": "text"})
    assert fixture is re.sub
