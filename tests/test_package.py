"""The package boundary: what the sdist and wheel hold, and that the wheel works on its own.

Builds with `python -m build` (isolated: hatchling comes from the package index) and installs
the wheel with no dependencies into a fresh venv outside the source tree, where no torch is
installed: the CLI and the verifier must work there with the standard library alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from dcp_invariant import __version__
from dcp_invariant.evidence import schema

pytestmark = pytest.mark.package

ROOT = Path(__file__).resolve().parent.parent
VERSION = "0.5.0"
DEBRIS = (
    "__pycache__",
    ".pyc",
    ".pytest_cache",
    ".ruff_cache",
    ".egg-info",
    ".git/",
    "/dist/",
    "/build/",
)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--wheel", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=900,
    )
    return out


@pytest.fixture(scope="module")
def venv(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(home / "env")], check=True, timeout=300)
    python = _venv_python(home / "env")
    [wheel] = dist.glob("*.whl")
    subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
        cwd=home,
    )
    return home / "env"


def _venv_python(env: Path) -> Path:
    return env / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _in_venv(env: Path, *args: str) -> subprocess.CompletedProcess[str]:
    scripts = env / ("Scripts" if os.name == "nt" else "bin")
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    clean["PATH"] = os.pathsep.join([str(scripts), clean.get("PATH", "")])
    return subprocess.run(
        list(args),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=env.parent,
        env=clean,
        check=False,
    )


def test_the_version_is_the_release(dist: Path) -> None:
    assert __version__ == VERSION
    assert sorted(p.name for p in dist.iterdir()) == [
        f"dcp_invariant-{VERSION}-py3-none-any.whl",
        f"dcp_invariant-{VERSION}.tar.gz",
    ]


def test_the_wheel_holds_only_the_package_and_its_metadata(dist: Path) -> None:
    [wheel] = dist.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    outside = [
        n
        for n in names
        if not n.startswith(("dcp_invariant/", f"dcp_invariant-{VERSION}.dist-info/"))
    ]
    assert outside == []
    assert not [n for n in names if any(d in f"/{n}" for d in DEBRIS)]
    for module in (
        "cli.py",
        "plan.py",
        "evidence/verify.py",
        "commit/store.py",
        "ranks/tasks.py",
        "suite/torchrun/launch.py",
        "suite/torchrun/guard.py",
    ):
        assert f"dcp_invariant/{module}" in names
    # Nothing shipped may need a checkout: the benchmark, which runs examples/, lives in tests/.
    wheel_zip = zipfile.ZipFile(wheel)
    needs_checkout = [
        n
        for n in names
        if n.endswith(".py")
        and re.search(rb"[\"'](examples|tests)[.:/]\w", wheel_zip.read(n)) is not None
    ]
    assert needs_checkout == []


def test_the_wheel_pins_torch_exactly_and_only_in_extras(dist: Path) -> None:
    [wheel] = dist.glob("*.whl")
    metadata = zipfile.ZipFile(wheel).read(f"dcp_invariant-{VERSION}.dist-info/METADATA").decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    torch = [r for r in requires if re.match(r"torch\b", r.split()[1])]
    # hatchling expands dev = [runtime, test, loops] into dev's own pins.
    assert sorted(torch) == [
        "Requires-Dist: torch==2.13.0; extra == 'dev'",
        "Requires-Dist: torch==2.13.0; extra == 'runtime'",
    ]
    assert all("extra ==" in r for r in requires), (
        "the core package must need the standard library only"
    )
    assert "Requires-Python: >=3.11" in metadata


def test_the_sdist_has_sources_and_tests_and_no_debris(dist: Path) -> None:
    [sdist] = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = [m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name]
    for wanted in (
        "pyproject.toml",
        "README.md",
        "docs/index.md",
        "mkdocs.yml",
        "CHANGELOG.md",
        "action.yml",
        "dcp_invariant/cli.py",
        "tests/suite/test_live.py",
        "tests/conftest.py",
        f"tests/data/artifact/{schema.MANIFEST_FILE}",
    ):
        assert wanted in names, wanted
    assert not [n for n in names if any(d in f"/{n}" for d in DEBRIS)]


def test_the_installed_wheel_runs_without_torch_outside_the_tree(
    venv: Path, data_artifact: Path
) -> None:
    where = _in_venv(
        venv, str(_venv_python(venv)), "-c", "import dcp_invariant; print(dcp_invariant.__file__)"
    )
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout
    assert _in_venv(venv, str(_venv_python(venv)), "-c", "import torch").returncode != 0

    version = _in_venv(venv, "dcp-invariant", "--version")
    assert version.stdout.strip() == f"dcp-invariant {VERSION}"
    helped = _in_venv(venv, "dcp-invariant", "--help")
    assert helped.returncode == 0
    assert all(command in helped.stdout for command in ("run", "verify", "list", "github-report"))

    verified = _in_venv(venv, "dcp-invariant", "verify", str(data_artifact))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    refused = _in_venv(
        venv, "dcp-invariant", "run", "--output-dir", "evidence", "--source-revision", "a" * 40
    )
    assert refused.returncode == 2
    assert "torch is not installed" in refused.stderr
    assert not (venv.parent / "evidence").exists()


# --- the wheel with its runtime: what a release promises -----------------------------------

EXAMPLES = ROOT / "examples"
RUN_TIMEOUT = 900
# pypa/gh-action-pypi-publish v1.8.14 (the release workflow's pin) uploads with these, from its
# requirements/runtime.txt at that tag: pkginfo 1.10 reads Metadata-Version up to 2.3 only.
PUBLISHER_TOOLS = ("twine==5.0.0", "pkginfo==1.10.0")
RELEASE_TOOLS = ("twine==7.0.0", "check-wheel-contents==0.6.3")


def _tool_venv(home: Path, *requirements: str) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(home)], check=True, timeout=300)
    subprocess.run(
        [str(_venv_python(home)), "-m", "pip", "install", "--quiet", *requirements],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return home


@pytest.mark.parametrize("tools", [PUBLISHER_TOOLS, RELEASE_TOOLS], ids=["publisher", "release"])
def test_the_release_tools_accept_the_dist(
    dist: Path, tmp_path: Path, tools: tuple[str, ...]
) -> None:
    env = _tool_venv(tmp_path / "tools", *tools)
    files = sorted(str(p) for p in dist.iterdir())
    checked = _in_venv(env, str(_venv_python(env)), "-m", "twine", "check", "--strict", *files)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    if any(t.startswith("check-wheel-contents") for t in tools):
        wheels = [f for f in files if f.endswith(".whl")]
        contents = _in_venv(env, "check-wheel-contents", *wheels)
        assert contents.returncode == 0, contents.stdout + contents.stderr


def _user_project(home: Path) -> Path:
    project = home / "project"
    (project / "examples").mkdir(parents=True)
    example = "mlp_fixture.py"
    (project / "examples" / example).write_bytes((EXAMPLES / example).read_bytes())
    return project


def test_uvx_runs_the_wheel_with_torchs_cpu_build(dist: Path, venv: Path, tmp_path: Path) -> None:
    """The README's uvx line, with the built wheel standing in for PyPI (--find-links); the
    torch-free install verifies what it wrote.

    The one run of the wheel with torch here: the integration job runs the live tests (the CLI
    on the examples, the pytest plugin in a user's suite) against an installation built from
    the same tree, outside it."""
    import shutil

    import local_torch_index

    uv = shutil.which("uv")
    if uv is None or not EXAMPLES.is_dir():
        pytest.skip("needs uv on PATH and examples/")
    project = _user_project(tmp_path)
    variables = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
    # A user's project outside any git checkout, with no revision given: recorded as unknown.
    variables.pop("GITHUB_SHA", None)
    variables.update(UV_CACHE_DIR=str(tmp_path / "uv-cache"), GIT_CEILING_DIRECTORIES=str(tmp_path))
    variables["UV_TOOL_DIR"] = str(tmp_path / "tools")
    command = [uv, "tool", "run", "--no-config", "--find-links", str(dist)]
    if sys.platform != "darwin":
        command += ["--torch-backend", "cpu"]
    command += ["--from", f"dcp-invariant[runtime]=={VERSION}", "dcp-invariant"]
    command += ["run", "--fixture", "examples.mlp_fixture:fixture", "--world-sizes", "1"]
    command += ["--output-dir", "evidence"]
    with contextlib.ExitStack() as stack:
        if local_torch_index.local_wheels():
            served = stack.enter_context(local_torch_index.serve(tmp_path / "index"))
            variables.update(served.environment())
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=project,
            env=variables, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pass: " in done.stdout, done.stdout
    assert "records the revision as 'unknown'" in done.stderr, done.stderr
    recorded = json.loads((project / "evidence" / "provenance.json").read_text(encoding="utf-8"))
    assert recorded["source_revision"] == "unknown"
    verified = _in_venv(venv, "dcp-invariant", "verify", str(project / "evidence"))
    assert verified.returncode == 0, verified.stdout + verified.stderr


# --- beside the user's own torch -------------------------------------------------------------


def _resolve(requirements: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """uv's resolver on PyPI alone, for Linux x86_64 and CPython 3.11: metadata only, nothing
    installed (not the project's UV_ settings: its find-links and sources are .ci/run's)."""
    import shutil

    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("needs uv on PATH")
    listed = tmp_path / "requirements.in"
    listed.write_text("\n".join(requirements) + "\n", encoding="utf-8")
    variables = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
    variables["UV_CACHE_DIR"] = str(tmp_path / "uv-cache")
    command = [uv, "pip", "compile", "--no-config", "--quiet", "--no-header", "--python-version"]
    command += ["3.11", "--python-platform", "x86_64-manylinux_2_28", str(listed)]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=variables, check=False
    )


@pytest.mark.parametrize("release", ["2.11.0", "2.13.0", "2.15.0"])
def test_the_package_resolves_beside_a_users_torch(
    dist: Path, tmp_path: Path, release: str
) -> None:
    """The library pins no torch: beside any registered release, as the README says to
    install it there (without the runtime extra)."""
    wheel = dist / f"dcp_invariant-{VERSION}-py3-none-any.whl"
    done = _resolve([f"dcp-invariant @ {wheel.as_uri()}", f"torch=={release}"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"\ntorch=={release}\n" in f"\n{done.stdout}", done.stdout


def test_the_runtime_extra_pins_the_measured_torch_exactly(dist: Path, tmp_path: Path) -> None:
    """The extra is the torch a release was measured with: beside another, no solution, which
    is why the README sends a user with a torch of their own to the package without it."""
    wheel = dist / f"dcp_invariant-{VERSION}-py3-none-any.whl"
    done = _resolve([f"dcp-invariant[runtime] @ {wheel.as_uri()}", "torch==2.14.1"], tmp_path)
    assert done.returncode != 0
    assert "depends on torch==2.13.0" in done.stderr, done.stderr
