"""The CI workflow's jobs, run here as written: every ubuntu job's steps, and the action's.

Each job of .github/workflows/ci.yml (its matrix expanded) is one test. The Linux jobs run on
this machine through :mod:`local_runner`, in the environment a hosted runner gives them, with
nothing installed but what the job installs; PyTorch's CPU index is served from this machine's
own wheels (:mod:`local_torch_index`). A job the machine cannot run (another OS, or a Python
without a CPU torch wheel here) is skipped, and the skip says which of its steps a Linux job
ran as is and which only GitHub can run.

Together the jobs run every test of this repository: the torch-free ones on each Python, the
live ones against the action's installation, the package ones on a built wheel. So when this
module runs, the session leaves the live and package tests to them (tests/conftest.py).

Inside a job (GITHUB_ACTIONS is set, here and on GitHub) this module skips itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
CI = REPO / ".github" / "workflows" / "ci.yml"
# Jobs run two at a time where neither runs live tests: the machine has two cores, and live
# tests (the integration jobs) must have them to themselves.
PARALLEL = 2

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
        import local_runner

        return local_runner.expand(local_runner.load_yaml(CI))
    except (ImportError, OSError):
        return []


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "job" in metafunc.fixturenames:
        jobs = _jobs()
        metafunc.parametrize("job", jobs or [None], ids=[j.name for j in jobs] or ["no-workflow"])


def _why_not_here(job: Any) -> str:
    """Why this machine cannot run a Linux job: a Python or a torch wheel it lacks."""
    import local_runner
    import local_torch_index

    for step in job.spec["steps"]:
        scope = local_runner.Scope({"matrix": job.matrix})
        python = scope.substitute((step.get("with") or {}).get("python-version", ""))
        if python and local_runner.installed_python(python) is None:
            return f"no CPython {python} on this machine"
        if step.get("uses") == "./" and (step.get("with") or {}).get("run-suite") != "false":
            action = local_runner.load_yaml(REPO / "action.yml")
            torch = action["inputs"]["torch-version"]["default"]
            if not local_torch_index.has_wheel(torch, python):
                return (
                    f"no CPU torch {torch} wheel for CPython {python} on this machine, and "
                    "PyTorch's CPU index is out of reach"
                )
    return ""


@pytest.fixture(scope="module")
def workflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Every job's result, by name: the Linux ones run, the others evaluated."""
    import local_runner
    import local_torch_index

    for tool in ("bash", "git", "openssl"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not on PATH")
    jobs = _jobs()
    root = tmp_path_factory.mktemp("workflow")
    with local_torch_index.serve(root / "index") as served:
        runner = local_runner.Runner(REPO, root / "run", served.environment())
        live = [i for i, j in enumerate(jobs) if j.on_linux and _runs_live_tests(j)]
        rest = [i for i in range(len(jobs)) if i not in live]
        results: dict[int, Any] = {}

        def run(i: int) -> Any:
            # A job the runner could not run fails that job's test alone.
            try:
                return runner.run(jobs[i], _why_not_here)
            except (OSError, subprocess.SubprocessError, local_runner.UnsupportedWorkflow) as exc:
                return exc

        with ThreadPoolExecutor(PARALLEL) as pool:
            for i, result in zip(rest, pool.map(run, rest), strict=True):
                results[i] = result
        for i in live:
            results[i] = run(i)
    ordered = [results[i] for i in range(len(jobs))]
    ran = [
        r
        if isinstance(r, local_runner.JobResult)
        else local_runner.JobResult("", "", skipped="the runner failed")
        for r in ordered
    ]
    yield {
        j.name: (r, local_runner.coverage(j, ran, jobs)) for j, r in zip(jobs, ordered, strict=True)
    }
    shutil.rmtree(root)


def _runs_live_tests(job: Any) -> bool:
    return any("-m live" in str(step.get("run", "")) for step in job.spec["steps"])


def test_the_job_passes_as_written(workflow: dict[str, Any], job: Any) -> None:
    if job is None:
        pytest.skip("no .github/workflows/ci.yml next to these tests, or no ruamel.yaml")
    result, coverage = workflow[job.name]
    if isinstance(result, BaseException):
        raise result
    if not job.on_linux:
        pytest.skip(coverage)
    if result.skipped:
        pytest.skip(f"{result.skipped}; not run here: every step")
    print(result.report())
    assert result.passed, f"{result.report()}\n{result.failures()}"
