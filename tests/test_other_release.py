"""What the other release's environment holds, where it lives and how uv makes it: pure, no
network."""

from __future__ import annotations

from pathlib import PurePath

import pytest

from dcp_invariant import other_release
from dcp_invariant.other_release import Recipe

HOME = PurePath("/home/u")
RECIPE = Recipe("2.15.0", "cpu-index", "3.11", "2.4.6", "linux", "x86_64")


@pytest.mark.parametrize(
    ("distribution", "build"),
    [("2.13.0+cpu", "cpu-index"), ("2.13.0", "pypi"), ("2.15.0", "pypi")],
)
def test_the_build_kind_is_the_installed_distributions(distribution: str, build: str) -> None:
    assert other_release.build_of(distribution) == build


def test_the_cache_is_the_flag_then_the_variable_then_the_users() -> None:
    env = {other_release.CACHE_ENV: "/var/cache/x", "XDG_CACHE_HOME": "/xdg"}
    assert other_release.cache_dir("/flag", env, "linux", HOME) == PurePath("/flag")
    assert other_release.cache_dir(None, env, "linux", HOME) == PurePath("/var/cache/x")
    assert other_release.cache_dir(None, {"XDG_CACHE_HOME": "/xdg"}, "linux", HOME) == PurePath(
        "/xdg/dcp-invariant"
    )


@pytest.mark.parametrize(
    ("platform", "environ", "expected"),
    [
        ("linux", {}, "/home/u/.cache/dcp-invariant"),
        ("linux", {"XDG_CACHE_HOME": "relative"}, "/home/u/.cache/dcp-invariant"),
        ("darwin", {}, "/home/u/Library/Caches/dcp-invariant"),
        ("win32", {"LOCALAPPDATA": "/L"}, "/L/dcp-invariant/Cache"),
        ("win32", {}, "/home/u/AppData/Local/dcp-invariant/Cache"),
    ],
)
def test_the_users_cache_directory_per_platform(
    platform: str, environ: dict[str, str], expected: str
) -> None:
    assert other_release.user_cache_dir(environ, platform, HOME) == PurePath(expected)


def test_every_field_that_changes_the_environment_changes_its_name() -> None:
    names = {
        RECIPE.name,
        Recipe("2.14.1", "cpu-index", "3.11", "2.4.6", "linux", "x86_64").name,
        Recipe("2.15.0", "pypi", "3.11", "2.4.6", "linux", "x86_64").name,
        Recipe("2.15.0", "cpu-index", "3.12", "2.4.6", "linux", "x86_64").name,
        Recipe("2.15.0", "cpu-index", "3.11", "2.3.0", "linux", "x86_64").name,
        Recipe("2.15.0", "cpu-index", "3.11", "2.4.6", "linux", "aarch64").name,
        Recipe("2.15.0", "cpu-index", "3.11", "2.4.6", "linux", "x86_64", "https://m/simple").name,
    }
    assert len(names) == 7


def test_a_cpu_build_takes_torch_from_pytorchs_cpu_index() -> None:
    (command,) = RECIPE.install_commands("uv", "/e/bin/python")
    assert command[:4] == ["uv", "pip", "install", "--no-config"]
    assert command[-4:] == ["--torch-backend", "cpu", "torch==2.15.0", "numpy==2.4.6"]


def test_pypis_build_takes_uvs_default_index() -> None:
    recipe = Recipe("2.15.0", "pypi", "3.11", "2.4.6", "linux", "x86_64")
    (command,) = recipe.install_commands("uv", "/e/bin/python")
    assert "--torch-backend" not in command and "--index" not in command
    assert command[-2:] == ["torch==2.15.0", "numpy==2.4.6"]


def test_an_index_of_the_users_serves_torch_and_numpy_comes_from_the_default() -> None:
    recipe = Recipe("2.15.0", "cpu-index", "3.11", "2.4.6", "linux", "x86_64", "file:///m")
    torch, numpy = recipe.install_commands("uv", "/e/bin/python")
    assert torch[-2:] == ["--index=file:///m", "torch==2.15.0"]
    assert numpy[-1] == "numpy==2.4.6" and not any(a.startswith("--index") for a in numpy)


def test_an_index_that_looks_like_an_option_stays_the_indexs_value() -> None:
    """DCP_INVARIANT_TORCH_INDEX=--help must not reach uv as its own option (issue #46)."""
    recipe = Recipe("2.15.0", "cpu-index", "3.11", "2.4.6", "linux", "x86_64", "--help")
    torch, _ = recipe.install_commands("uv", "/e/bin/python")
    assert "--help" not in torch and "--index=--help" in torch


def test_the_environment_is_made_on_the_runners_own_interpreter() -> None:
    command = RECIPE.venv_command("uv", "/usr/bin/python3.11", "/c/torch/e")
    assert command == [
        "uv",
        "venv",
        "--no-config",
        "--quiet",
        "--python",
        "/usr/bin/python3.11",
        "/c/torch/e",
    ]


def test_uvs_failure_is_one_line_with_its_cause() -> None:
    stderr = (
        "Using Python 3.11.7 environment at: e\n"
        "error: No solution found when resolving dependencies\n"
        "  cause: Because there is no version of numpy==2.4.6 ...\n\n"
        "hint: `numpy` was found on file:///x\n"
    )
    said = other_release.uv_error(stderr)
    assert said == (
        "error: No solution found when resolving dependencies "
        "(cause: Because there is no version of numpy==2.4.6 ...)"
    )
    assert "\n" not in said
    network = "error: Failed to fetch: `https://pypi.org/simple/torch/`\n  Caused by: dns error\n"
    assert other_release.uv_error(network).endswith("(Caused by: dns error)")
    assert other_release.uv_error("") == "uv printed nothing"
