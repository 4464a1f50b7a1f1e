"""The environment another torch release resumes in (``run --resume-with-torch RELEASE``).

What it holds, where it lives and which commands make it, torch-free and without I/O, so that
it is unit-tested without a network; :mod:`dcp_invariant.suite.release_env` runs the commands.

- **What**: torch at the requested release, in the build kind of the installed one (a CPU
  build, ``X+cpu``, from PyTorch's CPU index; PyPI's own build otherwise: the CUDA one on
  Linux, the CPU one on macOS and Windows), the runner's own NumPy, and this package, copied
  from where the runner imports it (it needs nothing else: ``dependencies = []``).
- **Where**: one directory per release, build, Python and platform under the cache directory
  (``--cache-dir``, else ``DCP_INVARIANT_CACHE_DIR``, else the platform's user cache), so a second
  run reuses it. A marker written last says it is complete.
- **How**: ``uv venv`` with the runner's interpreter, then ``uv pip install`` with no project
  configuration (``--no-config``: the user's ``pyproject.toml`` may route torch elsewhere). uv's
  ``--torch-backend cpu`` sends torch, and torch only, to PyTorch's CPU index
  (https://docs.astral.sh/uv/guides/integration/pytorch/); ``DCP_INVARIANT_TORCH_INDEX`` names
  an index uv searches before its default one (a mirror; ``uv pip install --index`` with uv's
  default ``first-index`` strategy: a package the index does not serve at all, or an index that
  cannot be read, falls back to the default, but an index that serves torch without the release
  fails the install; the probe then says which build came). uv's own environment variables
  (``UV_INDEX_URL``, ``UV_CACHE_DIR``...) apply as they do to any uv command.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Literal

Build = Literal["pypi", "cpu-index"]

CACHE_ENV = "DCP_INVARIANT_CACHE_DIR"
TORCH_INDEX_ENV = "DCP_INVARIANT_TORCH_INDEX"
MARKER = "dcp-invariant-env.json"  # written last: its presence says the environment is complete
# What a package's files are: the code and the data it reads (runtimes.json), nothing cached.
PACKAGE_SUFFIXES = (".py", ".json", ".typed")


def build_of(distribution: str) -> Build:
    """The kind of build an installed torch is, by its distribution version: PyTorch's CPU
    index serves ``X+cpu`` on Linux and Windows; every other registered build is PyPI's
    (``dcp_invariant/runtimes.json``). macOS wheels carry no suffix on either index and are the
    same CPU build, so PyPI's serves them (pytorch/pytorch#110791)."""
    return "cpu-index" if distribution.endswith("+cpu") else "pypi"


def user_cache_dir(environ: Mapping[str, str], platform: str, home: PurePath) -> PurePath:
    """The platform's per-user cache directory, with this tool's name: XDG's on Linux, Apple's
    on macOS, ``%LOCALAPPDATA%`` on Windows."""
    if platform == "darwin":
        return home / "Library" / "Caches" / "dcp-invariant"
    if platform == "win32":
        local = environ.get("LOCALAPPDATA")
        base = PurePath(local) if local else home / "AppData" / "Local"
        return base / "dcp-invariant" / "Cache"
    xdg = environ.get("XDG_CACHE_HOME")
    # XDG Base Directory Specification: a relative value is invalid and ignored.
    base = PurePath(xdg) if xdg and PurePath(xdg).is_absolute() else home / ".cache"
    return base / "dcp-invariant"


def cache_dir(
    given: str | None, environ: Mapping[str, str], platform: str, home: PurePath
) -> PurePath:
    """Where the environments live: ``--cache-dir``, else ``DCP_INVARIANT_CACHE_DIR``, else
    :func:`user_cache_dir`."""
    chosen = given or environ.get(CACHE_ENV)
    return PurePath(chosen) if chosen else user_cache_dir(environ, platform, home)


@dataclass(frozen=True)
class Recipe:
    """One release's environment: what it holds and how uv installs it."""

    release: str  # e.g. 2.15.0
    build: Build  # the installed torch's kind
    python: str  # the runner's "major.minor"
    numpy: str  # the runner's NumPy version: the same in both environments
    platform: str  # sys.platform
    machine: str  # platform.machine(), lowercased
    index: str | None = None  # DCP_INVARIANT_TORCH_INDEX: searched for torch first

    @property
    def name(self) -> str:
        """The environment's directory name: everything that makes two environments differ."""
        source = "" if self.index is None else "-own-index"
        return (
            f"torch-{self.release}-{self.build}{source}-numpy-{self.numpy}-py{self.python}-"
            f"{self.platform}-{self.machine}"
        )

    @property
    def requirements(self) -> list[str]:
        return [f"torch=={self.release}", f"numpy=={self.numpy}"]

    def venv_command(self, uv: str, runner_python: str, env_dir: str) -> list[str]:
        """An environment on the runner's own interpreter: the same Python, so the same
        version of every module this package's code relies on."""
        return [uv, "venv", "--no-config", "--quiet", "--python", runner_python, env_dir]

    def install_commands(self, uv: str, env_python: str) -> list[list[str]]:
        """torch from where its build comes from, then NumPy from uv's default index: an index
        named for torch may serve NumPy at other versions only, and uv takes a package from the
        first index that has it (its ``first-index`` strategy)."""
        base = [uv, "pip", "install", "--no-config", "--quiet", "--python", env_python]
        torch, numpy = self.requirements
        if self.index is not None:
            # One argument: a value that starts with "-" (DCP_INVARIANT_TORCH_INDEX=--help)
            # would otherwise reach uv as an option of its own.
            return [[*base, f"--index={self.index}", torch], [*base, numpy]]
        if self.build == "cpu-index":
            return [[*base, "--torch-backend", "cpu", torch, numpy]]
        return [[*base, torch, numpy]]


def env_python(env_dir: PurePath, platform: str) -> PurePath:
    """The interpreter of a virtual environment (venv's layout)."""
    return env_dir / ("Scripts/python.exe" if platform == "win32" else "bin/python")


def uv_error(stderr: str) -> str:
    """uv's failure in one line: its ``error:`` line and the cause it gives (``cause:``, or the
    innermost ``Caused by:``)."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    first = next((line for line in lines if line.startswith("error:")), None)
    if first is None:
        return lines[-1] if lines else "uv printed nothing"
    causes = [line for line in lines if line.startswith(("cause:", "Caused by:"))]
    return f"{first} ({causes[-1]})" if causes else first
