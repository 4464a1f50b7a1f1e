"""The release workflow's build job, run here as written (:mod:`local_workflows`) on a tag push,
beside ci.yml's jobs.

The build job's steps run as on a runner: the tag check, the tools, the build, twine and
check-wheel-contents, SHA256SUMS and the uploads. Its package tests (the wheel alone, then
with torch's CPU build through uvx) are the very step ci.yml's package-boundary job runs on
this same tree, which tests/test_local_workflow.py runs in this session: here that step is
skipped as covered, and a test checks that it still reads the same in both workflows. The
publish and github-release jobs need GitHub's OIDC token, PyPI's trusted publisher and the
GitHub API: only a GitHub run shows them; tests/test_workflows.py checks what they are given.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from dcp_invariant import __version__

PACKAGE_STEP = "Install the wheel and run it"

pytestmark = [
    pytest.mark.workflow,
    pytest.mark.skipif(
        os.environ.get("GITHUB_ACTIONS") == "true", reason="already inside a workflow job"
    ),
    pytest.mark.skipif(sys.platform != "linux", reason="the local runner stands in for ubuntu"),
]


def _release(runs: Any, tag: str) -> tuple[Any, Path]:
    """The build job's result on a push of ``tag``, and what it uploaded."""
    run = runs.release[tag]
    if isinstance(run.outcome, BaseException):
        raise run.outcome
    if run.outcome.skipped:
        pytest.skip(run.outcome.skipped)
    return run.outcome, run.uploads


def test_the_release_build_jobs_package_tests_are_the_package_jobs() -> None:
    """What the skip above rests on: the release's package tests are ci.yml's, word for word."""
    import local_workflows

    build = local_workflows.release_build_job()
    [step] = [s for s in build.spec["steps"] if s.get("name") == PACKAGE_STEP]
    assert not step.get("env") and step["run"] in local_workflows.package_steps()


def test_the_release_build_job_passes_on_the_versions_tag(workflow_runs: Any) -> None:
    import local_workflows

    result, uploads = _release(workflow_runs, local_workflows.VERSION_TAG)
    print(result.report())

    assert result.passed, f"{result.report()}\n{result.failures()}"
    skipped = {s.name: s.note for s in result.steps if s.outcome == "skipped"}
    assert list(skipped) == [PACKAGE_STEP] and skipped[PACKAGE_STEP].startswith("covered: ")
    dist = sorted(p.name for p in (uploads / "dist").iterdir())
    assert dist == [
        f"dcp_invariant-{__version__}-py3-none-any.whl",
        f"dcp_invariant-{__version__}.tar.gz",
    ]
    sums = (uploads / "sums" / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
    assert sums == [
        f"{hashlib.sha256((uploads / 'dist' / name).read_bytes()).hexdigest()}  {name}"
        for name in dist
    ]


def test_a_tag_that_is_not_the_version_stops_the_release_before_the_build(
    workflow_runs: Any,
) -> None:
    import local_workflows

    result, uploads = _release(workflow_runs, local_workflows.OTHER_TAG)
    outcomes = {s.name: s.outcome for s in result.steps}

    assert outcomes["The tag is the package's version"] == "failure"
    # Nothing is installed or built for a tag that cannot be released.
    assert outcomes["Install the build and check tools"] == "skipped"
    assert outcomes["Build"] == "skipped"
    assert "does not name the package's version" in next(
        s.log for s in result.steps if s.name == "The tag is the package's version"
    )
    assert outcomes["Build"] == "skipped"
    assert not (uploads / "dist").exists()
