"""Make, or reuse, the environment another torch release resumes in (:mod:`dcp_invariant.other_release`).

Once per release, build and Python: uv creates it under the cache directory, installs torch and
NumPy, this package is copied in, and the interpreter is asked which torch it imports, which must
be a registered runtime of the requested release. The marker is written last, so a build that
was killed is found incomplete and made again; a lock beside the environment keeps two runs from
building it at once. Any failure is one line and exit 2 (:class:`ReleaseEnvError`), before a
scenario runs, and leaves no half-made environment.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import dcp_invariant
from dcp_invariant import canonical, other_release, runtimes
from dcp_invariant.commit.errors import StoreError
from dcp_invariant.commit.lock import exclusive
from dcp_invariant.errors import ReleaseEnvError
from dcp_invariant.suite import installation

INSTALL_TIMEOUT = 1800.0  # PyPI's CUDA build of torch is several GB with its nvidia-* packages
PROBE_TIMEOUT = 300.0
PACKAGE = "dcp_invariant"
# What the environment's interpreter reports, as one JSON line.
_PROBE = (
    "import importlib.metadata as m, json, torch, numpy; "
    "print(json.dumps({'distribution': m.version('torch'), 'torch': torch.__version__, "
    "'numpy': numpy.__version__}))"
)


@dataclass(frozen=True)
class ReleaseEnv:
    """A complete environment: its interpreter and the torch it imports, and where this
    package's copy for its ranks is (first on their import path)."""

    release: str
    python: Path
    distribution: str  # importlib.metadata.version("torch") there
    torch: str  # torch.__version__ there
    package_path: Path
    directory: Path  # the environment's own directory under the cache

    def forget(self, timeout: float = INSTALL_TIMEOUT) -> None:
        """Have the next run make it afresh: it was found broken after it was made. Under the
        lock that ``ensure`` makes it under, so that no run is reading the marker meanwhile."""
        with exclusive(self.directory.parent / f"{self.directory.name}.lock", timeout):
            (self.directory / other_release.MARKER).unlink(missing_ok=True)


def find_uv(environ: dict[str, str] | None = None) -> str:
    """uv: the one running us (``uv run`` sets ``UV``), else on PATH, else the ``uv`` package's."""
    env = os.environ if environ is None else environ
    given = env.get("UV")
    if given and os.path.isfile(given):
        return given
    found = shutil.which("uv", path=env.get("PATH"))
    if found:
        return found
    if importlib.util.find_spec("uv") is not None:
        import uv  # type: ignore[import-not-found, unused-ignore]

        return str(uv.find_uv_bin())
    raise ReleaseEnvError(
        "--resume-with-torch: uv makes the other release's environment and is not installed: "
        "install it (python -m pip install uv), or drop --resume-with-torch"
    )


def recipe_for(
    release: str, distribution: str, environ: dict[str, str] | None = None
) -> other_release.Recipe:
    """The environment for ``release`` beside this runner (its torch ``distribution``)."""
    env = os.environ if environ is None else environ
    return other_release.Recipe(
        release=release,
        build=other_release.build_of(distribution),
        python=f"{sys.version_info.major}.{sys.version_info.minor}",
        numpy=_runner_numpy(),
        platform=sys.platform,
        machine=platform.machine().lower(),
        index=env.get(other_release.TORCH_INDEX_ENV) or None,
    )


def _runner_numpy() -> str:
    try:
        return importlib.metadata.version("numpy")
    except importlib.metadata.PackageNotFoundError:
        raise ReleaseEnvError(
            "--resume-with-torch: numpy is not installed beside this torch: install it (the "
            "other release's environment gets the same version)"
        ) from None


def package_digest(root: Path) -> str:
    """SHA-256 over this package's files (names and bytes): a changed package is copied again."""
    h = hashlib.sha256()
    for name in _package_files(root):
        h.update(name.encode() + b"\0" + (root / name).read_bytes() + b"\0")
    return h.hexdigest()


def ensure(
    recipe: other_release.Recipe, cache: Path, timeout: float = INSTALL_TIMEOUT
) -> ReleaseEnv:
    """The complete environment of ``recipe`` under ``cache``: reused, or made now."""
    envs = cache / "torch"
    env_dir = envs / recipe.name
    try:
        envs.mkdir(parents=True, exist_ok=True)
        # Another run may be making it: wait as long as a whole build may take (uv venv, at
        # most two installs, each under ``timeout``, then the probe).
        with exclusive(envs / f"{recipe.name}.lock", 3 * timeout + PROBE_TIMEOUT):
            made = _read_marker(env_dir)
            if made is None:
                _make(recipe, env_dir, timeout)
                made = _probe(recipe, env_dir)
                # Written whole or not at all: a kill here leaves no marker, not half of one.
                partial = env_dir / f"{other_release.MARKER}.partial"
                partial.write_bytes(canonical.dumps(made))
                os.replace(partial, env_dir / other_release.MARKER)
        package_path = _package_copy(cache)
    except StoreError as exc:  # the lock file itself cannot be used
        raise ReleaseEnvError(f"the cache directory {cache}: {exc}") from exc
    except OSError as exc:
        fix = "free space there, or" if exc.errno == errno.ENOSPC else "fix it, or"
        raise ReleaseEnvError(
            f"the cache directory {cache}: {exc.strerror or exc} ({exc.filename or 'no file'}): "
            f"{fix} pass --cache-dir DIR (or set {other_release.CACHE_ENV})"
        ) from exc
    python = Path(other_release.env_python(env_dir, sys.platform))
    return ReleaseEnv(
        recipe.release, python, str(made["distribution"]), str(made["torch"]), package_path, env_dir
    )


def _package_copy(cache: Path) -> Path:
    """This package as the runner imports it, once per content, under ``cache/packages``: a
    run with another copy of the package (another checkout) gets its own directory and never
    changes the one a concurrent run's ranks import. Made aside, then renamed into place."""
    package = Path(dcp_invariant.__file__).resolve().parent
    home = cache / "packages" / package_digest(package)
    if (home / PACKAGE / "__init__.py").is_file():
        return home
    home.parent.mkdir(parents=True, exist_ok=True)
    aside = Path(tempfile.mkdtemp(prefix=".partial-", dir=home.parent))
    try:
        for name in _package_files(package):
            destination = aside / PACKAGE / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(package / name, destination)
        try:
            os.rename(aside, home)
        except OSError:
            if not (home / PACKAGE / "__init__.py").is_file():
                raise  # not another run's copy that got there first
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    return home


def _read_marker(env_dir: Path) -> dict[str, object] | None:
    """The marker of a complete environment; None where it must be made (again)."""
    try:
        made = json.loads((env_dir / other_release.MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # absent, or cut short: the environment is made again
    python = Path(other_release.env_python(env_dir, sys.platform))
    if not isinstance(made, dict) or not python.exists():
        return None
    # A marker that names another torch than the environment holds (one installed into it
    # since, or a marker copied from elsewhere) is stale: its ranks would import the other one,
    # every run, and the runner would blame the import path. It is made again, like a build
    # that was cut short. Read from the installed metadata, not by importing torch: free.
    return made if installed_torch(env_dir) == [made.get("distribution")] else None


def installed_torch(env_dir: Path) -> list[str]:
    """The torch distributions a virtual environment's site-packages hold (one, where it is
    whole): what ``importlib.metadata.version("torch")`` reports there."""
    site = [*env_dir.glob("lib/python*/site-packages"), env_dir / "Lib" / "site-packages"]
    found = importlib.metadata.distributions(name="torch", path=[str(p) for p in site])
    return sorted(d.version for d in found)


def _make(recipe: other_release.Recipe, env_dir: Path, timeout: float) -> None:
    """uv venv, then uv pip install; what a failure left is removed."""
    uv = find_uv()
    if env_dir.exists():
        shutil.rmtree(env_dir)  # a build that was killed, or a marker that no longer reads
    python = str(other_release.env_python(env_dir, sys.platform))
    try:
        _run(recipe.venv_command(uv, sys.executable, str(env_dir)), recipe, timeout, env_dir)
        for command in recipe.install_commands(uv, python):
            _run(command, recipe, timeout)
    except BaseException:
        shutil.rmtree(env_dir, ignore_errors=True)
        raise


def _run(
    command: list[str], recipe: other_release.Recipe, timeout: float, venv: Path | None = None
) -> None:
    """One uv command; ``venv``: the environment ``uv venv`` makes, where this is that one."""
    # No VIRTUAL_ENV of the runner's: uv would take it for the environment meant.
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        raise ReleaseEnvError(
            f"--resume-with-torch {recipe.release}: uv did not finish installing torch "
            f"{recipe.release} within {timeout:.0f} s: check the network, then run again"
        ) from None
    except OSError as exc:
        raise ReleaseEnvError(
            f"--resume-with-torch {recipe.release}: uv cannot run: {exc}"
        ) from exc
    if done.returncode != 0 and venv is not None:
        # No download yet: the cache's filesystem or the interpreter is at fault, not the network.
        raise ReleaseEnvError(
            f"--resume-with-torch {recipe.release}: uv could not make the environment {venv}: "
            f"{other_release.uv_error(done.stderr)}; pass --cache-dir DIR (or set "
            f"{other_release.CACHE_ENV}) to a local directory you can write"
        )
    if done.returncode != 0:
        source = (
            f"{other_release.TORCH_INDEX_ENV}={recipe.index}"
            if recipe.index
            else "PyTorch's CPU index"
            if recipe.build == "cpu-index"
            else "PyPI"
        )
        raise ReleaseEnvError(
            f"--resume-with-torch {recipe.release}: uv could not install torch=={recipe.release} "
            f"from {source}: {other_release.uv_error(done.stderr)}; check the network, or set "
            f"{other_release.TORCH_INDEX_ENV} to an index that serves it"
        )


def _probe(recipe: other_release.Recipe, env_dir: Path) -> dict[str, object]:
    """Which torch the environment imports: a registered runtime of the requested release."""
    python = str(other_release.env_python(env_dir, sys.platform))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    try:
        done = subprocess.run(
            [python, "-I", "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            env=env,
            check=False,
        )
        reported = (
            json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
        )
    except (subprocess.TimeoutExpired, OSError, ValueError, IndexError):
        reported = None
    if not isinstance(reported, dict):
        shutil.rmtree(env_dir, ignore_errors=True)
        raise ReleaseEnvError(
            f"--resume-with-torch {recipe.release}: the environment uv made cannot import torch; "
            "run again to make it afresh"
        )
    runtime = runtimes.find(str(reported["distribution"]), str(reported["torch"]), sys.platform)
    if runtime is None or runtime.release != recipe.release:
        shutil.rmtree(env_dir, ignore_errors=True)
        raise ReleaseEnvError(
            f"--resume-with-torch {recipe.release}: uv installed torch "
            f"{reported['distribution']}/{reported['torch']}, not a registered build of "
            f"{recipe.release}: check what {other_release.TORCH_INDEX_ENV} or uv's own index "
            "settings serve"
        )
    return {
        "build": recipe.build,
        "distribution": reported["distribution"],
        "numpy": reported["numpy"],
        "release": recipe.release,
        "torch": reported["torch"],
    }


def _package_files(root: Path) -> list[str]:
    """The package's files, relative and sorted: its code and the data it reads, no caches."""
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file()
        and p.suffix in other_release.PACKAGE_SUFFIXES
        and "__pycache__" not in p.parts
    )


def worker_search_path() -> list[str]:
    """The runner's import path as the other release's ranks get it: where the fixture was
    found (the current directory for an empty entry, as multiprocessing's children get it), but
    neither the runner's standard library nor its site-packages, nor any directory that holds
    a torch or numpy of its own: either would shadow the environment's."""
    stdlib = {os.path.realpath(p) for p in installation.stdlib_directories()}
    excluded = {os.path.realpath(p) for p in installation.package_directories()}
    kept: list[str] = []
    for resolved in installation.import_path():
        if resolved in excluded:
            continue
        if any(resolved == lib or resolved.startswith(lib + os.sep) for lib in stdlib):
            continue  # the standard library, lib-dynload with it
        if any(os.path.isdir(os.path.join(resolved, name)) for name in ("torch", "numpy")):
            continue
        kept.append(resolved)
    return kept
