"""Save on one registered release, resume on another, live: the upgrade from the installed torch
to the newest release passes, and the downgrade back fails for its cause (2.15's sixth
TensorProperties field), each verified offline.

The newest release comes from where ``run --resume-with-torch`` takes it: PyTorch's CPU index
for a CPU build, else PyPI (on Linux the multi-GB CUDA build); a mirror given as
``DCP_INVARIANT_TORCH_INDEX`` in the environment is used as is. The downgrade's older release
comes from a file index of pip's own find-links wheel when this machine has one. Like the
newest-release tests, these run only when ``-m`` names ``release`` (tests/conftest.py):
.github/workflows/newest-torch.yml installs the CPU build of 2.13.0 and uv for them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from local_torch_index import local_wheels

from dcp_invariant import other_release, runtimes
from dcp_invariant.evidence import diagnosis
from dcp_invariant.evidence.verify import verify_artifact

pytestmark = [pytest.mark.live, pytest.mark.release]

REPO = Path(__file__).resolve().parents[2]
NEWEST = runtimes.releases()[-1]
INSTALLED = runtimes.installed_release()
RUN_TIMEOUT = 1800  # the first run installs the newest release
REVISION = "0123456789abcdef0123456789abcdef01234567"
FIXTURE = "examples.mlp_fixture:fixture"
NEEDS_AN_OLDER_RELEASE = pytest.mark.skipif(
    INSTALLED in ("", NEWEST), reason="needs an installed release older than the newest"
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("release-envs")
    try:
        yield path
    finally:
        shutil.rmtree(path)  # gigabytes


def run(
    python: str,
    out: Path,
    cache: Path,
    release: str,
    index: str | None,
    fixture: str = FIXTURE,
    cwd: Path = REPO,
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    if index is not None:
        env[other_release.TORCH_INDEX_ENV] = index
    return subprocess.run(
        [python, "-m", "dcp_invariant", "run", "--fixture", fixture, "--world-sizes", "1",
         "--output-dir", str(out), "--source-revision", REVISION,
         "--resume-with-torch", release, "--cache-dir", str(cache)],
        capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=cwd, env=env, check=False,
    )  # fmt: skip


def failed(out: Path) -> list[str]:
    """The scenarios ``verify`` fails in a valid artifact."""
    report = verify_artifact(out)
    assert report.valid, report.problems
    return [n for n, r in report.results.items() if r["verdict"] != "pass"]


def newest_python(cache: Path) -> str:
    (env_dir,) = [
        p for p in (cache / "torch").iterdir() if p.is_dir() and f"torch-{NEWEST}-" in p.name
    ]
    return str(other_release.env_python(env_dir, sys.platform))


def file_index(tmp_path: Path, release: str) -> str | None:
    """A simple index of pip's own CPU wheel of ``release`` for this Python, if there is one."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    found = [w for w in local_wheels() if w.version == f"{release}+cpu" and w.python_tag == tag]
    if not found:
        return None
    page = tmp_path / "index" / "torch" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text(f'<a href="{found[0].path.as_uri()}">{found[0].name}</a>\n', encoding="utf-8")
    return (tmp_path / "index").as_uri()


@NEEDS_AN_OLDER_RELEASE
def test_an_upgrade_to_the_newest_release_resumes_exactly(cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "evidence"
    done = run(sys.executable, out, cache, NEWEST, os.environ.get(other_release.TORCH_INDEX_ENV))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    name = f"upgrade_{INSTALLED}_to_{NEWEST}_1"
    assert f"pass  {name}" in done.stdout
    report = verify_artifact(out)
    assert report.valid and report.passed, report.problems


@NEEDS_AN_OLDER_RELEASE
def test_a_downgrade_from_the_newest_release_fails_for_its_cause(
    cache: Path, tmp_path: Path
) -> None:
    """Runs after the upgrade: its runner is the environment the upgrade made for the newest."""
    out = tmp_path / "evidence"
    index = file_index(tmp_path, INSTALLED) or os.environ.get(other_release.TORCH_INDEX_ENV)
    done = run(newest_python(cache), out, cache, INSTALLED, index)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    name = f"downgrade_{NEWEST}_to_{INSTALLED}_1"
    assert f"fail  {name}" in done.stdout
    assert f"- {diagnosis.DOES_NOT_LOAD_ON_OTHER}: torch {INSTALLED}" in done.stdout
    assert "too many values to unpack (expected 5)" in done.stdout
    assert "sixth field (strides)" in done.stdout
    assert failed(out) == [name]


@NEEDS_AN_OLDER_RELEASE
def test_a_key_renamed_between_releases_fails_the_upgrade_for_its_cause(
    cache: Path, tmp_path: Path
) -> None:
    """tests/release_loops.py names its model's state otherwise from 2.15 on: correct on each
    release (its resume passes), its checkpoint does not load across the rename."""
    out = tmp_path / "evidence"
    index = os.environ.get(other_release.TORCH_INDEX_ENV)
    fixture = "release_loops:renamed_by_release"
    done = run(sys.executable, out, cache, NEWEST, index, fixture, REPO / "tests")
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    name = f"upgrade_{INSTALLED}_to_{NEWEST}_1"
    assert "pass  resume_1" in done.stdout
    assert f"fail  {name}" in done.stdout
    assert (
        f"- {diagnosis.DOES_NOT_LOAD_ON_OTHER}: torch {NEWEST}" in done.stdout
        and "the checkpoint has no app.net." in done.stdout
    ), done.stdout[-3000:]
    assert failed(out) == [name]


@NEEDS_AN_OLDER_RELEASE
def test_a_fixture_that_does_not_import_in_the_other_environment_is_refused_up_front(
    cache: Path, tmp_path: Path
) -> None:
    out = tmp_path / "evidence"
    index = os.environ.get(other_release.TORCH_INDEX_ENV)
    fixture = "release_needs_pytest:fixture"
    done = run(sys.executable, out, cache, NEWEST, index, fixture, REPO / "tests")
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(
        f"dcp-invariant: error: --resume-with-torch {NEWEST}: in torch {NEWEST}'s"
    )
    assert "No module named 'pytest'" in line
    assert not out.exists() and done.stdout == ""
