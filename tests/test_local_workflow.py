"""The CI workflow's jobs, run here as written: every ubuntu job's steps, and the action's.

Each job of .github/workflows/ci.yml (its matrix expanded) is one test. The Linux jobs run on
this machine through :mod:`local_workflows`, in the environment a hosted runner gives them, with
nothing installed but what the job installs. A job the machine cannot run (another OS, or a
Python without a CPU torch wheel here) is skipped, and the skip says which of its steps a Linux
job ran as is and which only GitHub can run.

Together the jobs run every test of this repository: the torch-free ones on each Python, the
live ones against the action's installation, the package ones on a built wheel. So when this
module runs, the session leaves the live and package tests to them (tests/conftest.py).

Inside a job (GITHUB_ACTIONS is set, here and on GitHub) this module skips itself.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

pytestmark = [
    pytest.mark.workflow,
    pytest.mark.skipif(
        os.environ.get("GITHUB_ACTIONS") == "true", reason="already inside a workflow job"
    ),
    pytest.mark.skipif(sys.platform != "linux", reason="the local runner stands in for ubuntu"),
]


def _jobs() -> list[Any]:
    """The workflow's jobs, or none where it cannot be read (a copy of tests/ alone)."""
    try:
        import local_workflows

        return local_workflows.ci_jobs()
    except (ImportError, OSError):
        return []


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "job" in metafunc.fixturenames:
        jobs = _jobs()
        metafunc.parametrize("job", jobs or [None], ids=[j.name for j in jobs] or ["no-workflow"])


def test_the_job_passes_as_written(workflow_runs: Any, job: Any) -> None:
    if job is None:
        pytest.skip("no .github/workflows/ci.yml next to these tests, or no ruamel.yaml")
    result, coverage = workflow_runs.ci[job.name]
    if isinstance(result, BaseException):
        raise result
    if not job.on_linux:
        pytest.skip(coverage)
    if result.skipped:
        pytest.skip(f"{result.skipped}; not run here: every step")
    print(result.report())
    assert result.passed, f"{result.report()}\n{result.failures()}"
