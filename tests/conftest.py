"""Shared pytest fixtures over the checked-in artifact (see :mod:`artifact_data`)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from artifact_data import (
    DATA_ARTIFACT,
    Observations,
    read_observations,
    read_provenance,
    write_artifact,
)

from dcp_invariant import plan
from dcp_invariant.evidence import artifact

_TEMP_VARIABLES = ("TMPDIR", "TMP", "TEMP")

# pytest imports every module before it filters by marker, and the integration job installs
# pytest alone before `pytest -m live`: a module that needs a tool of the `test` extra at import
# is left out where that tool is missing, instead of stopping the collection.
_TESTS = Path(__file__).resolve().parent
_IMPORTS_HYPOTHESIS = re.compile(r"^(?:from|import) hypothesis\b", re.MULTILINE)
collect_ignore = (
    []
    if importlib.util.find_spec("hypothesis") is not None
    else sorted(
        str(path.relative_to(_TESTS))
        for path in _TESTS.rglob("test_*.py")
        if _IMPORTS_HYPOTHESIS.search(path.read_text(encoding="utf-8"))
    )
)


# The local runner's job reports, each step with its seconds, shown once the session ends: a
# passing job's output is captured, and .ci/run's time is what these jobs add up to.
JOB_REPORTS = pytest.StashKey[list[str]]()


@pytest.fixture(scope="session")
def workflow_runs(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Any]:
    """The jobs of the workflows this machine runs (:mod:`local_workflows`), run once, together:
    tests/test_local_workflow.py and tests/test_local_release.py judge them. A workflow whose
    tests this session does not run is not run."""
    for tool in ("bash", "git", "openssl"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not on PATH")
    import local_workflows

    modules = {item.path.name for item in request.session.items}
    root = tmp_path_factory.mktemp("workflows")
    runs = local_workflows.run_all(
        root, ci="test_local_workflow.py" in modules, release="test_local_release.py" in modules
    )
    reports = request.config.stash.setdefault(JOB_REPORTS, [])
    reports += [f"{r.report()}\n  [{r.seconds:.0f} s in all]" for r in runs.reported()]
    yield runs
    shutil.rmtree(root)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    reports = config.stash.get(JOB_REPORTS, [])
    if reports:
        terminalreporter.section("the workflow jobs run here, and each step's seconds")
        for report in reports:
            terminalreporter.write_line(report)


@pytest.fixture(scope="session", autouse=True)
def session_temp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This session's own temp directory, for it and every process it starts.

    The machine's temp directory is shared with other programs; a check that nothing was left
    behind can only look at a directory no one else writes to.
    """
    path = tmp_path_factory.mktemp("session-tmp")
    saved = {name: os.environ.get(name) for name in _TEMP_VARIABLES}
    os.environ.update(dict.fromkeys(_TEMP_VARIABLES, str(path)))
    tempfile.tempdir = None  # gettempdir() caches its answer; make it read TMPDIR again
    try:
        yield path
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        tempfile.tempdir = None


@pytest.fixture
def one_rank_group() -> Iterator[Any]:
    """A world of one in this process (an in-memory store, no other process), as a worker of
    world size 1 has: a DTensor's device mesh and a fixture's DDP need a process group. Yields
    that world's device mesh."""
    torch = pytest.importorskip("torch")
    dist = torch.distributed
    if not dist.is_available():
        pytest.skip("this torch build has no torch.distributed")
    from torch.distributed.device_mesh import DeviceMesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield DeviceMesh("cpu", [0])
    finally:
        dist.destroy_process_group()


@pytest.fixture
def data_artifact() -> Path:
    return DATA_ARTIFACT


@pytest.fixture
def artifact_copy(tmp_path: Path) -> Path:
    """A writable copy of the checked-in artifact."""
    target = tmp_path / "artifact"
    shutil.copytree(DATA_ARTIFACT, target)
    return target


@pytest.fixture
def rebuild(tmp_path: Path) -> Callable[[Callable[[Observations], None]], Path]:
    """Build a new, internally consistent artifact from mutated copies of the real observations.

    The result is valid (results, summary, JUnit and manifest re-derived), so what it tests is
    the verdict the rules give, not the verifier's integrity checks.
    """
    counter = iter(range(1_000_000))

    def make(mutate: Callable[[Observations], None]) -> Path:
        observations = read_observations(DATA_ARTIFACT)
        mutate(observations)
        target = tmp_path / f"rebuilt-{next(counter)}"
        write_artifact(
            target,
            artifact.build(observations, read_provenance(DATA_ARTIFACT), run_plan=plan.REGISTERED),
        )
        return target

    return make


# Tests that install the newest registered torch as PyPI's default build (on Linux x86_64 the
# CUDA one, about 5 GB): .github/workflows/newest-torch.yml runs them weekly and on every release
# tag; anywhere else they run only when the -m expression names this marker.
RELEASE_MARKER = "release"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave out the release tests unless asked for, and leave to the workflow's jobs the tests
    they run, when they run here.

    tests/test_local_workflow.py runs the CI workflow's Linux jobs: the quality jobs run the
    torch-free tests on each Python, the integration job the live tests against the action's
    installation, the package job the package tests. Running them in this session too would
    only repeat them. An explicit ``-m``, or a session that does not collect that module (or
    runs inside a job, where it skips itself), keeps every test.
    """
    markexpr = config.option.markexpr or ""
    if RELEASE_MARKER not in markexpr:
        _deselect(config, items, [i for i in items if i.get_closest_marker(RELEASE_MARKER)])
    if markexpr or os.environ.get("GITHUB_ACTIONS") == "true":
        return
    if not any(item.get_closest_marker("workflow") for item in items):
        return
    _deselect(config, items, [i for i in items if not i.get_closest_marker("workflow")])


def _deselect(config: pytest.Config, items: list[pytest.Item], moved: list[pytest.Item]) -> None:
    if moved:
        gone = set(moved)
        config.hook.pytest_deselected(items=moved)
        items[:] = [i for i in items if i not in gone]
