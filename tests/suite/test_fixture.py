"""Resolving ``--fixture MODULE:CALLABLE``: what a module that cannot be imported, or a callable that cannot be called, is told (torch-free).

A worker runs ``load_fixture`` in its scenario's workspace, with the directory ``run`` was started
in first on ``sys.path`` (cli._run puts it there): the tests set both up that way.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from dcp_invariant.errors import FixtureError
from dcp_invariant.suite.fixture import Anchored, check_shape, load_fixture


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


def test_a_module_name_longer_than_a_file_name_is_not_found_beside_a_src_directory(
    project: Path,
) -> None:
    """Looking for it under src/ failed with ENAMETOOLONG, which reached the worker as a
    traceback, so the probe did not refuse it and every scenario ran on it."""
    (project / "src").mkdir()
    name = "m" * 300
    message = refusal(f"{name}:make_app")
    assert message.startswith(f"fixture '{name}:make_app': cannot import '{name}'"), message
    assert message.endswith(f"check the name, run where {name} is, or install it"), message


def test_src_already_on_the_path_is_not_suggested_again(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (project / "src" / "dcpi_src_again").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(project / "src"))
    monkeypatch.syspath_prepend(str(project))  # the current directory stays first
    message = refusal("dcpi_src_again.missing:make_app")
    assert "PYTHONPATH=src" not in message, message
    assert message.endswith("check the name, run where dcpi_src_again is, or install it")


# The CLI's one line and exit 2 for such a module are shown end to end in test_fixture_live.py.
@pytest.mark.parametrize(
    ("source", "attr", "message"),
    [
        (
            "def fixture(rank, world_size):\n    pass\n",
            "no_such_name",
            "has no attribute 'no_such_name'",
        ),
        ("SEED = 1234\n", "SEED", "'SEED' is not callable"),
        (
            "def needs_width(rank, world_size, width):\n    pass\n",
            "needs_width",
            "needs_width(rank, world_size, width) cannot be called as needs_width(rank, "
            "world_size) (missing a required argument: 'width'); pass its other parameters "
            "with --fixture-arg NAME=VALUE",
        ),
        (
            "import os\nimport nonexistent_pkg_for_dcp_invariant\n",
            "fixture",
            "failed: {path}:2: ModuleNotFoundError: No module named "
            "'nonexistent_pkg_for_dcp_invariant'; install nonexistent_pkg_for_dcp_invariant",
        ),
        (
            "X = 1\n\nraise RuntimeError('no config')\n",
            "fixture",
            "failed: {path}:3: RuntimeError: no config; fix the module so that 'import",
        ),
    ],
    ids=["no-such-name", "not-callable", "needs-an-argument", "missing-dependency", "raises"],
)
def test_a_module_or_callable_outside_the_interface_is_named_with_the_fix(
    project: Path, request: pytest.FixtureRequest, source: str, attr: str, message: str
) -> None:
    # A module name of its own per case: an imported module stays in sys.modules.
    name = "dcpi_" + re.sub(r"\W", "_", request.node.callspec.id)
    (project / f"{name}.py").write_text(source, encoding="utf-8")
    path = (project / f"{name}.py").resolve()
    assert message.format(path=path) in refusal(f"{name}:{attr}")


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


class _Shape:
    def __init__(self, *methods: str) -> None:
        for name in methods:
            setattr(self, name, lambda *args: None)


@pytest.mark.parametrize(
    ("methods", "message"),
    [
        (("step",), "lacks state_dict(), load_state_dict(): the app needs step() -> float and "
         "either state_dict() and load_state_dict(sd) (the tool saves through DCP) or "
         "save(checkpoint_dir) and load(checkpoint_dir) (the app saves itself)"),
        (("step", "save", "state_dict", "load_state_dict"),
         "with save() but no load(): an app that saves itself needs both"),
        (("step", "load"), "with load() but no save()"),
        (("save", "load"), "lacks step()"),
    ],
)  # fmt: skip
def test_an_app_without_a_whole_shape_is_named_by_what_it_lacks(
    methods: tuple[str, ...], message: str
) -> None:
    with pytest.raises(FixtureError, match=re.escape(message)):
        check_shape("m:f", _Shape(*methods))


@pytest.mark.parametrize(
    "methods",
    [
        ("step", "state_dict", "load_state_dict"),
        ("step", "save", "load"),
        ("step", "save", "load", "state_dict"),  # what it loaded is compared; nothing else
        ("step", "save", "load", "state_dict", "load_state_dict"),
    ],
)
def test_either_whole_shape_is_an_app(methods: tuple[str, ...]) -> None:
    check_shape("m:f", _Shape(*methods))
    app = Anchored(_Shape(*methods), os.getcwd())
    assert app.checkpointing == ("app" if "save" in methods else "dcp")
    assert app.has_state == ("state_dict" in methods)


def test_fixture_arguments_that_complete_the_call_are_accepted() -> None:
    fixture: object = load_fixture("re:sub", {"string": "text"})
    assert fixture is re.sub


@pytest.mark.parametrize(
    ("record", "says"),
    [
        (None, "starting a worker for it took more than 20 s (raise --timeout if"),
        ({"phase": "build"}, "importing it and calling m:f(0, 1) took more than 20 s"),
        ({"phase": "state_dict"}, "its app's first state_dict() took more than 20 s"),
        ({"phase": "step"}, "its app's first step() took more than 20 s"),
        (
            {"phase": "state_dict_after_step"},
            "its app's state_dict() after the first step took more than 20 s",
        ),
        (
            {"phase": "done", "threads": []},
            "its first step() returned, but the worker did not exit within 20 s",
        ),
        (
            {"phase": "done", "threads": ["loader", "writer"]},
            "its first step() returned, but left 2 non-daemon thread(s) running (loader, "
            "writer), and a worker exits only once those end: they had not after 20 s; make "
            "them daemon threads (daemon=True) or stop and join them before step() returns",
        ),
        (
            {"phase": "done", "threads": [f"t{i}" for i in range(50)]},
            "(t0, t1, t2, t3, t4, t5, t6, t7 and 42 more)",
        ),
    ],
    ids=["no record", "build", "state", "step", "state after", "exit", "threads", "50 threads"],
)
def test_a_probe_that_times_out_names_the_phase_it_was_in(
    record: dict[str, object] | None, says: str
) -> None:
    """The probe records each phase as it starts; its timeout names the one under way, not
    "building it and taking one step" whatever it was stuck in."""
    from dcp_invariant.suite.runner import _probe_timeout

    full = None if record is None else {"problem": None, "threads": [], **record}
    message = _probe_timeout("m:f", 20.0, full)
    assert message.startswith("fixture 'm:f': timeout: ")
    assert says in message, message
    assert "\n" not in message
