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
import re
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
# The jobs without live tests run together, then the live ones alone: on 2 cores the two quality
# jobs take about 170 s each and the package boundary 110 s, part of it waiting on builds and
# installs; the live tests (the integration jobs) keep both cores busy and have them to
# themselves.
PARALLEL = 3

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


def _needs(job: Any) -> tuple[list[str], list[tuple[str, str, str]]]:
    """The Pythons a job sets up, and (torch, Python, torch's matrix key) of each suite run by
    the action in it."""
    import local_runner

    action = local_runner.load_yaml(REPO / "action.yml")["inputs"]
    scope = local_runner.Scope({"matrix": job.matrix})
    pythons, suites = [], []
    for step in job.spec["steps"]:
        given = step.get("with") or {}
        if str(step.get("uses", "")).startswith("actions/setup-python@"):
            pythons.append(scope.substitute(given.get("python-version", "")))
        if step.get("uses") == "./" and given.get("run-suite", "true") != "false":
            python = scope.substitute(
                given.get("python-version", action["python-version"]["default"])
            )
            written = str(given.get("torch-version", action["torch-version"]["default"]))
            key = re.fullmatch(r"\$\{\{\s*matrix\.([\w-]+)\s*\}\}", written)
            pythons.append(python)
            suites.append((scope.substitute(written), python, key[1] if key else ""))
    return pythons, suites


def _plan(jobs: list[Any]) -> list[tuple[str, dict[str, str]]]:
    """For each job, why this machine cannot run it (or ""), and the matrix values it runs with
    instead of the written ones.

    The action installs the matrix's torch from PyPI's CPU index, served here from this
    machine's CPU wheels. Where it has no wheel of that release, the first such job that runs
    the live tests runs with a release it has, and says so; the others are skipped. So the
    live tests always run in the action's installation, as the workflow runs them.
    """
    import local_runner
    import local_torch_index

    plans: list[tuple[str, dict[str, str]]] = []
    substituted = False
    for job in jobs:
        pythons, suites = _needs(job) if job.on_linux else ([], [])
        missing = [p for p in pythons if p and local_runner.installed_python(p) is None]
        reason, overrides = (
            (f"no CPython {missing[0]} on this machine", {}) if missing else ("", {})
        )
        reason = reason or _between_pythons(job, jobs)
        for torch, python, key in suites:
            if reason or local_torch_index.has_wheel(torch, python):
                continue
            here = [
                w.version.split("+")[0]
                for w in local_torch_index.local_wheels()
                if w.python_tag == "cp" + python.replace(".", "")
            ]
            if key and here and _runs_live_tests(job) and not substituted:
                overrides = {key: here[0]}
                substituted = True
            else:
                reason = (
                    f"no CPU torch {torch} wheel for CPython {python} on this machine, and "
                    "PyTorch's CPU index is out of reach"
                )
        plans.append((reason, overrides))
    return plans


@pytest.fixture(scope="module")
def workflow(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[dict[str, Any]]:
    """Every job's result, by name: the Linux ones run, the others evaluated."""
    import local_runner
    import local_torch_index
    from conftest import record_job_report

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
        plans = _plan(jobs)

        def run(i: int) -> Any:
            reason, overrides = plans[i]
            # A job the runner could not run fails that job's test alone.
            try:
                return runner.run(jobs[i], lambda job: reason, overrides)
            except (OSError, subprocess.SubprocessError, local_runner.UnsupportedWorkflow) as exc:
                return exc

        with ThreadPoolExecutor(PARALLEL) as pool:
            for i, result in zip(rest, pool.map(run, rest), strict=True):
                results[i] = result
        for i in live:
            results[i] = run(i)
    ordered = [results[i] for i in range(len(jobs))]
    for result in ordered:
        if isinstance(result, local_runner.JobResult) and not result.skipped:
            record_job_report(pytestconfig, result)
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


def _between_pythons(job: Any, jobs: list[Any]) -> str:
    """Why a Linux job is left to GitHub here: its matrix Python lies strictly between the
    oldest and the newest of its job's, which run here with the same steps (the session's time
    is bounded; a failure on 3.12 alone, with 3.11 and 3.13 passing, is the least likely one)."""
    if "python" not in job.matrix or not job.on_linux:
        return ""
    versions = sorted(
        {j.matrix["python"] for j in jobs if j.key == job.key and j.on_linux},
        key=lambda v: tuple(int(x) for x in v.split(".")),
    )
    if job.matrix["python"] in (versions[0], versions[-1]):
        return ""
    return (
        f"Python {job.matrix['python']} lies between {versions[0]} and {versions[-1]}, whose "
        "jobs ran these steps here; GitHub runs it"
    )


def _runs_live_tests(job: Any) -> bool:
    return any('-m "live or torch"' in str(step.get("run", "")) for step in job.spec["steps"])


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
