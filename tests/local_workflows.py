"""Which jobs of this repository's workflows run here, and running them together, once a session.

ci.yml's jobs (its matrix expanded) and release.yml's build job on two tag pushes run through
:mod:`local_runner` on this machine, in the environment a hosted runner gives them, with
PyTorch's CPU index served from this machine's own wheels (:mod:`local_torch_index`). A job the
machine cannot run (another OS, or a Python without a CPU torch wheel here) is not run, and
says which of its steps a Linux job ran as is and which only GitHub can run.

The jobs without live tests run together, then the live ones alone: on 2 cores the quality job
(of the newest Python only, see :func:`older_python`) takes about 160 s and the package boundary
about 105 s, part of it waiting on builds and installs, and the release builds (about 25 s,
mostly installs) follow the package boundary while the quality job still runs. The live tests (the integration jobs) keep both cores busy and
have them to themselves. tests/test_local_workflow.py and tests/test_local_release.py judge the
results.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import local_runner
import local_torch_index

from dcp_invariant import __version__

REPO = Path(__file__).resolve().parents[1]
CI = REPO / ".github" / "workflows" / "ci.yml"
RELEASE = REPO / ".github" / "workflows" / "release.yml"
PARALLEL = 3
# The release build job runs on a push of each: the version's tag, and one that is not it.
VERSION_TAG = f"v{__version__}"
OTHER_TAG = "v0.0.0-not-the-version"


def ci_jobs() -> list[local_runner.Job]:
    return local_runner.expand(local_runner.load_yaml(CI))


def release_build_job() -> local_runner.Job:
    [build] = [j for j in local_runner.expand(local_runner.load_yaml(RELEASE)) if j.key == "build"]
    return build


def package_steps() -> dict[str, str]:
    """The package-boundary job's steps, by their ``run:`` text: the release build job's
    package tests are these, which the package boundary runs in the same session."""
    [package] = [j for j in ci_jobs() if j.key == "package-boundary"]
    return {
        step["run"]: "ci.yml's package-boundary job (tests/test_local_workflow.py)"
        for step in package.spec["steps"]
        if "run" in step and not step.get("env")
    }


def runs_live_tests(job: local_runner.Job) -> bool:
    return any('-m "live or torch"' in str(step.get("run", "")) for step in job.spec["steps"])


def _needs(job: local_runner.Job) -> tuple[list[str], list[tuple[str, str, str]]]:
    """The Pythons a job sets up, and (torch, Python, torch's matrix key) of each suite run by
    the action in it."""
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


def plan(jobs: list[local_runner.Job]) -> list[tuple[str, dict[str, str]]]:
    """For each job, why this machine cannot run it (or ""), and the matrix values it runs with
    instead of the written ones.

    The action installs the matrix's torch from PyPI's CPU index, served here from this
    machine's CPU wheels. Where it has no wheel of that release, the first such job that runs
    the live tests runs with a release it has, and says so; the others are skipped. So the
    live tests always run in the action's installation, as the workflow runs them.
    """
    plans: list[tuple[str, dict[str, str]]] = []
    substituted = False
    for job in jobs:
        pythons, suites = _needs(job) if job.on_linux else ([], [])
        missing = [p for p in pythons if p and local_runner.installed_python(p) is None]
        reason, overrides = (
            (f"no CPython {missing[0]} on this machine", {}) if missing else ("", {})
        )
        reason = reason or older_python(job, jobs)
        for torch, python, key in suites:
            if reason or local_torch_index.has_wheel(torch, python):
                continue
            here = [
                w.version.split("+")[0]
                for w in local_torch_index.local_wheels()
                if w.python_tag == "cp" + python.replace(".", "")
            ]
            if key and here and runs_live_tests(job) and not substituted:
                overrides = {key: here[0]}
                substituted = True
            else:
                reason = (
                    f"no CPU torch {torch} wheel for CPython {python} on this machine, and "
                    "PyTorch's CPU index is out of reach"
                )
        plans.append((reason, overrides))
    return plans


def older_python(job: local_runner.Job, jobs: list[local_runner.Job]) -> str:
    """Why a Linux job is left to GitHub here: its matrix Python is older than the newest of its
    job's, which runs the same steps here.

    The session's time is bounded (.ci/run in 15 minutes on 2 cores), and those steps are the
    torch-free checks: a failure on an older Python alone is the least likely one, and the
    oldest, 3.11, is the interpreter of this session's live, package and release jobs. GitHub
    runs every Python on every change.
    """
    if "python" not in job.matrix or not job.on_linux:
        return ""
    newest = max(
        (j.matrix["python"] for j in jobs if j.key == job.key and j.on_linux),
        key=lambda v: tuple(int(x) for x in v.split(".")),
    )
    if job.matrix["python"] == newest:
        return ""
    return f"Python {newest}'s job ran these steps here; GitHub runs Python {job.matrix['python']}"


# A job's result, or what stopped the runner from running it (that job's test fails alone).
Outcome = local_runner.JobResult | OSError | subprocess.SubprocessError | AssertionError


@dataclass(frozen=True)
class ReleaseRun:
    outcome: Outcome
    uploads: Path  # what the job uploaded, by artifact name


@dataclass(frozen=True)
class Runs:
    ci: dict[str, tuple[Outcome, str]]  # by job name: the outcome, and local_runner.coverage
    release: dict[str, ReleaseRun]  # by tag

    def reported(self) -> list[local_runner.JobResult]:
        """The jobs that ran, in the order the session's summary lists them."""
        versions = [r.outcome for tag, r in self.release.items() if tag == VERSION_TAG]
        outcomes = [*versions, *(o for o, _ in self.ci.values())]
        return [o for o in outcomes if isinstance(o, local_runner.JobResult) and not o.skipped]


def _attempt(run: Callable[[], local_runner.JobResult]) -> Outcome:
    """``run()``'s result, or what stopped the runner: that job's test then fails alone."""
    try:
        return run()
    except (OSError, subprocess.SubprocessError, local_runner.UnsupportedWorkflow) as exc:
        return exc


def run_all(root: Path, *, ci: bool = True, release: bool = True) -> Runs:
    """Every job this machine can run, each under ``root``: ci.yml's (if ``ci``) and the release
    builds (if ``release``)."""
    jobs = ci_jobs() if ci else []
    plans = plan(jobs)
    with local_torch_index.serve(root / "index") as served:
        runner = local_runner.Runner(REPO, root / "ci", served.environment())
        releases = {
            tag: local_runner.Runner(
                REPO,
                root / f"release-{n}",
                served.environment(),
                ref=f"refs/tags/{tag}",
                workflow="release",
                covered=package_steps(),
            )
            for n, tag in enumerate((VERSION_TAG, OTHER_TAG) if release else ())
        }
        build = release_build_job()

        def run_ci(i: int) -> Outcome:
            reason, overrides = plans[i]
            return _attempt(lambda: runner.run(jobs[i], lambda job: reason, overrides))

        def run_release(tag: str) -> Outcome:
            return _attempt(lambda: releases[tag].run(build))

        live = [i for i, j in enumerate(jobs) if j.on_linux and runs_live_tests(j)]
        rest = [i for i in range(len(jobs)) if i not in live]
        outcomes: dict[int, Outcome] = {}
        with ThreadPoolExecutor(PARALLEL) as pool:
            # Longest first: the release builds fill the slot the package boundary leaves.
            ci_futures = {i: pool.submit(run_ci, i) for i in rest}
            release_futures = {tag: pool.submit(run_release, tag) for tag in releases}
            outcomes.update({i: f.result() for i, f in ci_futures.items()})
            released = {tag: f.result() for tag, f in release_futures.items()}
        for i in live:
            outcomes[i] = run_ci(i)
    ordered = [outcomes[i] for i in range(len(jobs))]
    ran = [
        o
        if isinstance(o, local_runner.JobResult)
        else local_runner.JobResult("", "", skipped="the runner failed")
        for o in ordered
    ]
    return Runs(
        ci={
            j.name: (o, local_runner.coverage(j, ran, jobs))
            for j, o in zip(jobs, ordered, strict=True)
        },
        release={
            tag: ReleaseRun(released[tag], releases[tag].uploads.directory) for tag in releases
        },
    )
