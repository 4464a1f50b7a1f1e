"""The release workflow's build job, run here as written (:mod:`local_runner`) on a tag push.

The build job's steps run as on a runner: the tools, the tag check, the build, twine and
check-wheel-contents, the package tests (the wheel installed with torch's CPU build: run, verify,
the pytest plugin), SHA256SUMS and the uploads. The publish and github-release jobs need
GitHub's OIDC token, PyPI's trusted publisher and the GitHub API: only a GitHub run shows them;
tests/test_workflows.py checks what they are given.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from dcp_invariant import __version__

REPO = Path(__file__).resolve().parents[1]
RELEASE = REPO / ".github" / "workflows" / "release.yml"

pytestmark = [
    pytest.mark.workflow,
    pytest.mark.skipif(
        os.environ.get("GITHUB_ACTIONS") == "true", reason="already inside a workflow job"
    ),
    pytest.mark.skipif(sys.platform != "linux", reason="the local runner stands in for ubuntu"),
]


def _build_job(tag: str, root: Path) -> Any:
    import local_runner
    import local_torch_index

    for tool in ("bash", "git", "openssl"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not on PATH")
    [build] = [j for j in local_runner.expand(local_runner.load_yaml(RELEASE)) if j.key == "build"]
    with local_torch_index.serve(root / "index") as served:
        runner = local_runner.Runner(
            REPO, root / "run", served.environment(), ref=f"refs/tags/{tag}", workflow="release"
        )
        return runner.run(build), runner.uploads.directory


def test_the_release_build_job_passes_on_the_versions_tag(tmp_path: Path) -> None:
    result, uploads = _build_job(f"v{__version__}", tmp_path)
    if result.skipped:
        pytest.skip(result.skipped)
    print(result.report())

    assert result.passed, f"{result.report()}\n{result.failures()}"
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
    tmp_path: Path,
) -> None:
    result, uploads = _build_job("v0.0.0-not-the-version", tmp_path)
    if result.skipped:
        pytest.skip(result.skipped)
    outcomes = {s.name: s.outcome for s in result.steps}

    assert outcomes["The tag is the package's version"] == "failure"
    assert "does not name pyproject.toml's version" in next(
        s.log for s in result.steps if s.name == "The tag is the package's version"
    )
    assert outcomes["Build"] == "skipped"
    assert not (uploads / "dist").exists()
