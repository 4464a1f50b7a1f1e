"""The other release's environment, made by a stand-in uv (no network): the commands uv is
given, the marker that makes a second run reuse it, a build that was killed made again, and
every failure one line, leaving no half-made environment."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import sys
import sysconfig
from pathlib import Path
from typing import Any, cast

import pytest

from dcp_invariant import canonical, other_release, plan
from dcp_invariant.errors import ReleaseEnvError
from dcp_invariant.suite import release_env, runner
from dcp_invariant.suite.pool import GroupOutcome

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the stand-in uv is a shell script")

RECIPE = other_release.Recipe("2.15.0", "cpu-index", "3.11", "2.4.6", "linux", "x86_64")
# The stand-in: logs each call, makes a venv whose python reports $FAKE_PAIR, fails with
# $FAKE_FAIL on `pip install`, with $FAKE_VENV_FAIL on `venv`; `pip install` leaves torch's
# metadata at version $FAKE_DIST.
FAKE_UV = r"""#!/bin/sh
echo "$*" >> "$FAKE_LOG"
if [ "$1" = venv ] && [ -n "$FAKE_VENV_FAIL" ]; then printf '%b' "$FAKE_VENV_FAIL" >&2; exit 2; fi
if [ "$1" = venv ]; then
  for last; do :; done
  mkdir -p "$last/bin" "$last/lib/python3.11/site-packages"
  printf '#!/bin/sh\necho %s\n' "'$FAKE_PAIR'" > "$last/bin/python"
  chmod +x "$last/bin/python"
  exit 0
fi
if [ -n "$FAKE_FAIL" ]; then printf '%b' "$FAKE_FAIL" >&2; exit 2; fi
python=""; previous=""
for arg; do [ "$previous" = --python ] && python="$arg"; previous="$arg"; done
info="$(dirname "$(dirname "$python")")/lib/python3.11/site-packages/torch-$FAKE_DIST.dist-info"
mkdir -p "$info"
printf 'Metadata-Version: 2.1\nName: torch\nVersion: %s\n' "$FAKE_DIST" > "$info/METADATA"
exit 0
"""
PAIR = {"distribution": "2.15.0", "torch": "2.15.0+cu132", "numpy": "2.4.6"}


@pytest.fixture
def fake_uv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    uv = tmp_path / "bin" / "uv"
    uv.parent.mkdir()
    uv.write_text(FAKE_UV, encoding="utf-8")
    uv.chmod(uv.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "uv.log"
    monkeypatch.setenv("UV", str(uv))
    monkeypatch.setenv("FAKE_LOG", str(log))
    monkeypatch.setenv("FAKE_PAIR", json.dumps(PAIR))
    monkeypatch.setenv("FAKE_DIST", PAIR["distribution"])
    monkeypatch.delenv("FAKE_FAIL", raising=False)
    monkeypatch.delenv("FAKE_VENV_FAIL", raising=False)
    monkeypatch.setattr(sys, "platform", "linux")
    return log


def calls(log: Path) -> list[str]:
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


def test_the_first_run_makes_the_environment_and_the_second_reuses_it(
    fake_uv: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    made = release_env.ensure(RECIPE, cache)
    env_dir = cache / "torch" / RECIPE.name
    package = Path(release_env.__file__).resolve().parents[1]
    home = cache / "packages" / release_env.package_digest(package)
    assert made == release_env.ReleaseEnv(
        "2.15.0", env_dir / "bin/python", "2.15.0", "2.15.0+cu132", home, env_dir
    )
    venv, install = calls(fake_uv)
    assert venv.startswith("venv --no-config --quiet --python ")
    assert install.endswith("--torch-backend cpu torch==2.15.0 numpy==2.4.6")
    copied = home / "dcp_invariant"
    assert (copied / "__init__.py").is_file() and (copied / "runtimes.json").is_file()
    assert not list(copied.rglob("__pycache__"))
    marker = canonical.loads((env_dir / other_release.MARKER).read_bytes())
    assert marker["torch"] == "2.15.0+cu132" and marker["release"] == "2.15.0"

    assert release_env.ensure(RECIPE, cache) == made
    assert len(calls(fake_uv)) == 2  # reused: uv ran no more


def test_another_copy_of_the_package_gets_its_own_directory_without_reinstalling(
    fake_uv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two checkouts sharing a cache: neither run's ranks see the other's package change."""
    cache = tmp_path / "cache"
    first = release_env.ensure(RECIPE, cache).package_path
    monkeypatch.setattr(release_env, "package_digest", lambda root: "f" * 64)
    second = release_env.ensure(RECIPE, cache).package_path
    assert second == cache / "packages" / ("f" * 64)
    assert (first / "dcp_invariant" / "__init__.py").is_file()
    assert (second / "dcp_invariant" / "__init__.py").is_file()
    assert len(calls(fake_uv)) == 2  # the environment itself was reused
    assert not [p for p in (cache / "packages").iterdir() if p.name.startswith(".partial-")]


def test_an_environment_found_broken_is_made_again_on_the_next_run(
    fake_uv: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    release_env.ensure(RECIPE, cache).forget()  # as the runner does when its ranks cannot start
    release_env.ensure(RECIPE, cache)
    assert len(calls(fake_uv)) == 4


def test_a_marker_that_names_another_torch_than_the_environment_holds_is_made_again(
    fake_uv: Path, tmp_path: Path
) -> None:
    """torch reinstalled into the environment after it was made: its marker is stale."""
    cache = tmp_path / "cache"
    env_dir = release_env.ensure(RECIPE, cache).directory
    (info,) = env_dir.glob("lib/python3.11/site-packages/torch-*.dist-info")
    (info / "METADATA").write_text("Name: torch\nVersion: 2.14.1\n", encoding="utf-8")
    assert release_env.installed_torch(env_dir) == ["2.14.1"]
    made = release_env.ensure(RECIPE, cache)
    assert len(calls(fake_uv)) == 4  # made again, not reused
    assert release_env.installed_torch(env_dir) == ["2.15.0"] and made.distribution == "2.15.0"


def test_a_build_that_was_killed_is_made_again(fake_uv: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    env_dir = cache / "torch" / RECIPE.name
    (env_dir / "bin").mkdir(parents=True)
    (env_dir / "half-written").write_text("", encoding="utf-8")  # no marker: never completed
    release_env.ensure(RECIPE, cache)
    assert not (env_dir / "half-written").exists()
    assert len(calls(fake_uv)) == 2


def test_an_install_that_fails_is_one_line_and_leaves_nothing(
    fake_uv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "FAKE_FAIL",
        "error: Failed to fetch: `https://download.pytorch.org/whl/cpu/torch/`\\n  Caused by: dns error\\n",
    )
    cache = tmp_path / "cache"
    with pytest.raises(ReleaseEnvError) as caught:
        release_env.ensure(RECIPE, cache)
    said = str(caught.value)
    assert "\n" not in said
    assert said.startswith(
        "--resume-with-torch 2.15.0: uv could not install torch==2.15.0 from PyTorch's CPU index"
    )
    assert "(Caused by: dns error)" in said and other_release.TORCH_INDEX_ENV in said
    assert not (cache / "torch" / RECIPE.name).exists()
    assert caught.value.exit_code == 2


def test_a_torch_that_is_not_the_release_asked_for_is_refused(
    fake_uv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "FAKE_PAIR", json.dumps({**PAIR, "distribution": "2.14.1", "torch": "2.14.1+cu130"})
    )
    cache = tmp_path / "cache"
    with pytest.raises(
        ReleaseEnvError,
        match=r"uv installed torch 2\.14\.1/2\.14\.1\+cu130, not a registered build of 2\.15\.0",
    ):
        release_env.ensure(RECIPE, cache)
    assert not (cache / "torch" / RECIPE.name).exists()


def test_without_uv_the_run_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        ReleaseEnvError, match=r"uv makes the other release's environment and is not installed"
    ):
        release_env.find_uv({"PATH": str(tmp_path)})


def test_a_cache_directory_that_cannot_be_made_is_named(fake_uv: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("", encoding="utf-8")
    with pytest.raises(ReleaseEnvError, match="pass --cache-dir DIR"):
        release_env.ensure(RECIPE, blocker / "cache")


def test_the_workers_import_path_leaves_out_the_runners_installation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project, shadow = tmp_path / "project", tmp_path / "modules"
    project.mkdir()
    (shadow / "torch").mkdir(parents=True)  # a torch of its own, as an HPC module tree has
    site_packages = next(p for p in sys.path if p.endswith("site-packages"))
    sysconfig.get_paths()  # read while the standard library is still on the path
    monkeypatch.chdir(project)
    monkeypatch.setattr(sys, "path", ["", site_packages, str(shadow), str(project), os.devnull])
    assert release_env.worker_search_path() == [os.path.realpath(project)]


class _OnePool:
    """A pool whose one group ends as ``outcome`` says, its log in ``tmp``."""

    timeout = 7.0

    def __init__(self, tmp: Path, *, timed_out: bool = False, log: str = "", code: int = 1) -> None:
        self.log = tmp / "probe.log"
        self.log.write_text(log)
        self.outcome = GroupOutcome([code], timed_out, [], [self.log])

    def run_group(self, *_: object) -> GroupOutcome:
        return self.outcome


@pytest.mark.parametrize(
    ("pool_says", "says", "forgotten"),
    [
        (
            {"timed_out": True, "code": -9},
            "did not import torch and resolve the fixture within 7 s: give more with --timeout",
            False,
        ),
        (
            {
                "log": "Traceback (most recent call last):\nImportError: libtorch_cpu.so: cannot open"
            },
            "exited [1]: ImportError: libtorch_cpu.so: cannot open; it is made afresh on the next",
            True,
        ),
        (
            {"log": "RuntimeError: something else"},
            "exited [1]: RuntimeError: something else",
            False,
        ),
    ],
)
def test_a_probe_that_fails_forgets_only_a_broken_environment(
    fake_uv: Path, tmp_path: Path, pool_says: dict[str, Any], says: str, forgotten: bool
) -> None:
    """A busy machine's timeout, or a failure that is not the installation's, keeps the cached
    environment for the other runs that share it; an import that fails has the next run make
    it afresh."""
    env = release_env.ensure(RECIPE, tmp_path / "cache")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    pool = _OnePool(tmp_path, **pool_says)
    with pytest.raises(ReleaseEnvError) as caught:
        runner._probe_release(
            cast(Any, pool), workspace, env, "m:f", plan.fixture_plan("m:f", (1,))
        )
    assert str(caught.value).startswith("--resume-with-torch 2.15.0: a rank in torch 2.15.0's")
    assert says in str(caught.value), str(caught.value)
    assert "\n" not in str(caught.value)
    assert (env.directory / other_release.MARKER).exists() is not forgotten


def test_an_environment_uv_cannot_make_names_the_cache_not_the_network(
    fake_uv: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``uv venv`` downloads nothing: where it fails (a filesystem without symlinks, say), the
    fix is another cache directory."""
    monkeypatch.setenv("FAKE_VENV_FAIL", "error: failed to symlink file\n")
    cache = tmp_path / "cache"
    with pytest.raises(ReleaseEnvError) as caught:
        release_env.ensure(RECIPE, cache)
    said = str(caught.value)
    assert said.startswith("--resume-with-torch 2.15.0: uv could not make the environment ")
    assert "failed to symlink file" in said and "pass --cache-dir DIR" in said, said
    assert "network" not in said and "\n" not in said
    assert len(calls(fake_uv)) == 1  # nothing installed after it
    assert not (cache / "torch" / RECIPE.name).exists()
