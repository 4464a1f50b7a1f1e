"""Two small robustness promises, live (issue #46, item 5).

- A cached ``--resume-with-torch`` environment whose marker names another torch than the one
  installed in it (torch reinstalled there since) is made again, not blamed on the user's
  import path at every run.
- A Ctrl-C in the run's first second, while the runner and its helper interpreters start, is
  one line and exit 130: no helper prints a ``KeyboardInterrupt`` traceback.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import proc_state
import pytest
from local_torch_index import local_wheels

from dcp_invariant import canonical, other_release, runtimes
from dcp_invariant.suite import pool, release_env

pytestmark = pytest.mark.live

REPO = Path(__file__).resolve().parents[2]
REVISION = "0123456789abcdef0123456789abcdef01234567"
FIXTURE = "examples.mlp_fixture:fixture"
INTERRUPTED = "dcp-invariant: interrupted: nothing written"
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dcp_invariant", "run", "--source-revision", REVISION, *args]


def installed_cpu_wheel() -> Path | None:
    """pip's own find-links CPU wheel of the installed torch for this Python, if any."""
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    distribution = importlib.metadata.version("torch")
    found = [w for w in local_wheels() if w.version == distribution and w.python_tag == tag]
    return found[0].path if found else None


def file_index(root: Path, wheel: Path) -> str:
    """A simple index that serves torch, but only ``wheel``: uv asks it, and no other, for torch."""
    page = root / "torch" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text(f'<a href="{wheel.as_uri()}">{wheel.name}</a>\n', encoding="utf-8")
    return root.as_uri()


def stale_environment(recipe: other_release.Recipe, env_dir: Path, wheel: Path) -> None:
    """What ``ensure`` leaves for ``recipe``, with the installed torch in it instead: its
    marker names the release asked for, as if torch had been reinstalled there since."""
    uv = release_env.find_uv()
    python = str(other_release.env_python(env_dir, sys.platform))
    for command in (
        recipe.venv_command(uv, sys.executable, str(env_dir)),
        [uv, "pip", "install", "--no-config", "--quiet", "--python", python, str(wheel),
         f"numpy=={recipe.numpy}"],
    ):  # fmt: skip
        subprocess.run(command, capture_output=True, timeout=600, check=True)
    build = f"{recipe.release}+cpu"
    marker = {"build": recipe.build, "distribution": build, "numpy": recipe.numpy,
              "release": recipe.release, "torch": build}  # fmt: skip
    (env_dir / other_release.MARKER).write_bytes(canonical.dumps(marker))


@linux_only
def test_an_environment_whose_marker_names_another_torch_is_made_again(tmp_path: Path) -> None:
    installed = runtimes.installed_release()
    wheel = installed_cpu_wheel()
    if wheel is None or shutil.which("uv") is None:
        pytest.skip("needs uv and the installed torch's CPU wheel in pip's find-links")
    asked = next(r for r in reversed(runtimes.releases()) if r != installed)
    index = file_index(tmp_path / "index", wheel)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    environ[other_release.TORCH_INDEX_ENV] = index
    recipe = release_env.recipe_for(asked, importlib.metadata.version("torch"), environ)
    cache = tmp_path / "cache"
    env_dir = cache / "torch" / recipe.name
    try:
        stale_environment(recipe, env_dir, wheel)
        assert release_env.installed_torch(env_dir) == [importlib.metadata.version("torch")]
        out = tmp_path / "out"
        done = subprocess.run(
            cli("--fixture", FIXTURE, "--world-sizes", "1", "--output-dir", str(out),
                "--resume-with-torch", asked, "--cache-dir", str(cache)),
            capture_output=True, text=True, timeout=600, cwd=REPO, env=environ, check=False,
        )  # fmt: skip
        # Made again: uv is asked for the release, which this index does not serve, so the
        # run stops there, one line, and what the rebuild began is gone with the stale one.
        # Before, the ranks imported the environment's other torch and the run blamed the
        # import path ("holds another torch"), keeping the environment for the next run.
        assert done.returncode == 2, done.stderr[-3000:]
        assert "holds another torch" not in done.stderr
        last = done.stderr.strip().splitlines()[-1]
        assert last.startswith(
            f"dcp-invariant: error: --resume-with-torch {asked}: uv could not install "
            f"torch=={asked} from {other_release.TORCH_INDEX_ENV}={index}: "
        ), done.stderr[-3000:]
        assert "Traceback" not in done.stderr
        assert not env_dir.exists() and not out.exists()
    finally:
        shutil.rmtree(cache, ignore_errors=True)  # the environment is hundreds of MB


# Where a Ctrl-C used to find a process starting with SIGINT deliverable: the runner importing
# its modules (up to 0.3 s), the fork server or a spawned standby importing multiprocessing and
# the package (0.2 to 0.8 s), each before it leaves the terminal's process group.
DELAYS = (0.1, 0.2, 0.3, 0.35, 0.4, 0.5, 0.6, 0.8)


@linux_only
@pytest.mark.parametrize("start_method", [None, "spawn"])
def test_an_early_ctrl_c_prints_one_line_and_no_traceback(
    tmp_path: Path, start_method: str | None
) -> None:
    """Ctrl-C as a terminal sends it, to the whole process group, at several moments of the
    start; each run stops with the one line, exit 130, nothing written, nothing left."""
    for n, delay in enumerate(DELAYS):
        tmpdir = tmp_path / f"tmp-{n}"
        tmpdir.mkdir()
        env = {**os.environ, "TMPDIR": str(tmpdir)}
        if start_method is not None:
            env[pool.START_METHOD_ENV] = start_method
        out = tmp_path / f"out-{n}"
        proc = subprocess.Popen(
            cli("--fixture", FIXTURE, "--output-dir", str(out)),
            cwd=REPO, env=env, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            time.sleep(delay)
            if sys.platform == "win32":  # POSIX only: skipped there
                raise NotImplementedError
            os.killpg(proc.pid, signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)
        said = f"at {delay} s: {stdout[-2000:]}{stderr[-3000:]}"
        assert "Traceback" not in stdout + stderr, said
        # 130, or death by the SIGINT itself, which a shell reports as 130 too: CPython ends so
        # once any code it ran through PyRun_* ended in KeyboardInterrupt (Py_RunMain in
        # Modules/main.c), which a signal under load can reach before the handler is in place.
        assert proc.returncode in (130, -signal.SIGINT), said
        assert stderr.strip().splitlines() == [INTERRUPTED], said
        assert not out.exists(), said
        running = str(tmpdir)
        assert proc_state.wait_until(lambda r=running: not proc_state.processes_with(r), 2.0), (
            proc_state.describe(proc_state.processes_with(running))
        )
