"""The newest registered torch release, installed as PyPI's default build, runs the checks.

On Linux x86_64 that build is the CUDA one (several GB with its nvidia-* dependencies): what
most training environments have. It runs the CPU/Gloo scenarios on a machine without a GPU.
The registered suite and a fixture run of the example must pass on it, and ``verify`` must
accept both artifacts; the provenance names the build that ran.

pip runs with no configuration (PIP_CONFIG_FILE is the null device, no PIP_* variable): a
machine's own pip settings may cap torch or offer a local CPU wheel instead. The download is
worth its cost weekly and before a release, not on every change: these tests run only when
``-m`` names ``release`` (tests/conftest.py), as .github/workflows/newest-torch.yml does.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dcp_invariant import canonical, runtimes, wheels
from dcp_invariant.evidence import schema
from dcp_invariant.evidence.verify import verify_artifact

pytestmark = [pytest.mark.live, pytest.mark.release]

REPO = Path(__file__).resolve().parents[2]
NEWEST = runtimes.releases()[-1]
INSTALL_TIMEOUT = 1800
RUN_TIMEOUT = 900
REVISION = "0123456789abcdef0123456789abcdef01234567"


def _pip_environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}
    env["PIP_CONFIG_FILE"] = os.devnull
    return env


@pytest.fixture(scope="module")
def newest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A venv holding PyPI's default build of the newest release, numpy and this package."""
    venv = tmp_path_factory.mktemp("newest-release") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    install = subprocess.run(
        [
            str(python), "-m", "pip", "install", "--disable-pip-version-check", "--quiet",
            f"torch=={NEWEST}", "numpy==2.4.6", str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
        env=_pip_environment(),
        check=False,
    )  # fmt: skip
    if install.returncode != 0:
        shutil.rmtree(venv)
        pytest.fail(f"pip install torch=={NEWEST} failed: {install.stderr[-3000:]}")
    try:
        yield python
    finally:
        shutil.rmtree(venv)  # gigabytes


def run(python: Path, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-m", "dcp_invariant", "run", "--output-dir", str(out),
         "--source-revision", REVISION, *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith("PYTHON")},
        check=False,
    )  # fmt: skip


def pypi_entry() -> wheels.Entry:
    """The registered PyPI wheel of the newest release for this OS and architecture."""
    arch = {"AMD64": "x64", "x86_64": "x86_64", "aarch64": "aarch64", "arm64": "arm64"}
    here = arch.get(platform.machine(), platform.machine())
    for entry in wheels.load():
        if (entry.release, entry.build, entry.sys_platform) == (NEWEST, "pypi", sys.platform):
            if entry.target.endswith(here):
                return entry
    raise AssertionError(f"no PyPI wheel of {NEWEST} registered for {sys.platform} {here}")


@pytest.mark.parametrize(
    "arguments",
    [[], ["--fixture", "examples.mlp_fixture:fixture"]],
    ids=["registered suite", "example fixture"],
)
def test_it_passes_on_pypis_build_of_the_newest_release(
    newest: Path, tmp_path: Path, arguments: list[str]
) -> None:
    out = tmp_path / "evidence"
    done = run(newest, out, *arguments)
    assert done.returncode == 0, done.stderr[-4000:]
    report = verify_artifact(out)
    assert report.valid and report.passed, report.problems
    provenance = canonical.loads((out / schema.PROVENANCE_FILE).read_bytes())
    entry = pypi_entry()
    assert (provenance["torch_distribution"], provenance["torch_runtime"]) == (
        entry.distribution,
        entry.torch,
    )
