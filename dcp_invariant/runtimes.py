"""The torch runtimes dcp-invariant supports, as (installed distribution, ``torch.__version__``).

Read from ``runtimes.json``, which :mod:`dcp_invariant.wheels` writes from the wheels themselves.
The rendezvous-store digest is what the torchrun guard requires before it patches anything:
``inspect.getsource`` of ``torch.distributed.elastic.rendezvous.c10d_rendezvous_backend.
_create_tcp_store``, UTF-8, SHA-256.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from dcp_invariant.errors import UnsupportedRuntime

REGISTRY_FILE = Path(__file__).with_name("runtimes.json")
LINUX_WINDOWS = ("linux", "win32")


@dataclass(frozen=True)
class Runtime:
    distribution: str  # importlib.metadata.version("torch")
    torch: str  # torch.__version__
    create_tcp_store_bytes: int
    create_tcp_store_sha256: str
    # sys.platform values where a registered wheel reports this pair.
    platforms: tuple[str, ...] = LINUX_WINDOWS
    release: str = ""  # e.g. 2.15.0


def _load() -> tuple[Runtime, ...]:
    """The pairs of the wheels measured into runtimes.json (dcp_invariant/wheels.py writes it).

    Wheels of one release that report the same pair on several platforms (the CPU builds of
    Linux and Windows, say) make one runtime registered on each of those platforms.
    """
    records = json.loads(REGISTRY_FILE.read_text(encoding="utf-8"))["wheels"]
    merged: dict[tuple[str, str, int, str, str], list[str]] = {}
    for r in records:
        key = (
            r["distribution"],
            r["torch"],
            r["create_tcp_store_bytes"],
            r["create_tcp_store_sha256"],
            r["release"],
        )
        platforms = merged.setdefault(key, [])
        if r["sys_platform"] not in platforms:
            platforms.append(r["sys_platform"])
    return tuple(
        Runtime(d, t, n, digest, tuple(sorted(p)), release)
        for (d, t, n, digest, release), p in merged.items()
    )


RUNTIMES: tuple[Runtime, ...] = _load()
DEFAULT_TORCH_VERSION = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
REGISTER_COMMAND = "python -m dcp_invariant.wheels RELEASE"


def release_key(release: str) -> tuple[int, ...]:
    """Sorts releases in version order: 2.9.0 before 2.11.0."""
    return tuple(int(p) for p in release.split("."))


def releases() -> list[str]:
    """The registered releases, oldest first."""
    return sorted({r.release for r in RUNTIMES}, key=release_key)


def find(distribution: str, torch_version: str, platform: str | None = None) -> Runtime | None:
    """The registered runtime of this pair (on ``platform``, when given)."""
    for runtime in RUNTIMES:
        if (runtime.distribution, runtime.torch) == (distribution, torch_version) and (
            platform is None or platform in runtime.platforms
        ):
            return runtime
    return None


def release_of(distribution: str, platform: str) -> str:
    """The release of a registered distribution on ``platform`` ("" when none is)."""
    for runtime in RUNTIMES:
        if runtime.distribution == distribution and platform in runtime.platforms:
            return runtime.release
    return ""


def installed_distribution() -> str | None:
    """The installed torch's distribution version, read without importing it."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_release() -> str:
    """The registered release of the installed torch (what ``--resume-with-torch`` names its
    scenarios after); "" where none is installed, or it is not registered here (the plan says
    so, after it has checked the releases it was given)."""
    return release_of(installed_distribution() or "", sys.platform)


def registered_pairs(platform: str | None = None) -> str:
    return ", ".join(
        f"{r.distribution}/{r.torch}"
        for r in RUNTIMES
        if platform is None or platform in r.platforms
    )


def install_command(version: str = "") -> str:
    """The command that installs a registered torch as its CPU wheel: on Linux PyPI's default
    build is the CUDA one: registered too, but a multi-GB download, and `run` uses no GPU."""
    return (
        f"python -m pip install torch=={version or DEFAULT_TORCH_VERSION} --index-url {CPU_INDEX}"
    )


def require(distribution: str | None, torch_version: str | None = None) -> None:
    """Check what can be checked: the distribution alone, or the exact pair once torch is imported."""
    if distribution is None:
        raise UnsupportedRuntime(
            f"torch is not installed: install the CPU wheel with {install_command()}"
        )
    here = sys.platform
    if torch_version is None:
        if any(r.distribution == distribution and here in r.platforms for r in RUNTIMES):
            return
        installed = f"{distribution}/(not imported)"
    else:
        if find(distribution, torch_version, here) is not None:
            return
        installed = f"{distribution}/{torch_version}"
    raise UnsupportedRuntime(
        f"unregistered torch runtime {installed} (distribution/torch.__version__) on {here}; "
        f"registered releases: {', '.join(releases())}, as PyPI's and the CPU index's builds "
        f"(pairs: dcp_invariant/runtimes.json); install one, or register yours with "
        f"{REGISTER_COMMAND}"
    )
