"""The torch runtimes dcp-invariant supports, as (installed distribution, ``torch.__version__``).

The rendezvous-store digest is what the torchrun guard requires before it patches anything:
``inspect.getsource`` of ``torch.distributed.elastic.rendezvous.c10d_rendezvous_backend.
_create_tcp_store``, UTF-8, SHA-256, measured from each registered wheel.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

LINUX_WINDOWS = ("linux", "win32")
MACOS = ("darwin",)


@dataclass(frozen=True)
class Runtime:
    distribution: str  # importlib.metadata.version("torch")
    torch: str  # torch.__version__
    create_tcp_store_bytes: int
    create_tcp_store_sha256: str
    # sys.platform values whose CPU wheel reports this pair.
    platforms: tuple[str, ...] = LINUX_WINDOWS


_TORCH_2_13 = ("ddecedb8b053ba2db6a1cfbbe27bdeedc70a1951716b7d603e20f90513e473b6", 2191)
_TORCH_2_11 = ("488aee8200995402157248d051fc337c9dd02b77dc460ddb9abd2b5bf22bc19f", 2195)

RUNTIMES: tuple[Runtime, ...] = (
    # Measured here with the local 2.13.0 CPU wheel; the one the test suite runs.
    Runtime("2.13.0+cpu", "2.13.0+cpu", _TORCH_2_13[1], _TORCH_2_13[0]),
    # PyTorch's CPU index (and PyPI) serve macOS arm64 wheels without the +cpu suffix
    # (pytorch/pytorch#110791: "ARM binaries do not have +cpu suffix (same as MacOS ones)");
    # the rendezvous function's source is the same in every wheel of a release.
    Runtime("2.13.0", "2.13.0", _TORCH_2_13[1], _TORCH_2_13[0], MACOS),
    # Registered by the original v0.2.0 release: wheels from PyPI and from the CPU index.
    Runtime("2.11.0", "2.11.0+cpu", _TORCH_2_11[1], _TORCH_2_11[0]),
    Runtime("2.11.0+cpu", "2.11.0+cpu", _TORCH_2_11[1], _TORCH_2_11[0]),
    Runtime("2.11.0", "2.11.0", _TORCH_2_11[1], _TORCH_2_11[0], MACOS),
)
DEFAULT_TORCH_VERSION = "2.13.0"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


class UnsupportedRuntime(Exception):
    """The installed torch is not one dcp-invariant has registered."""


def find(distribution: str, torch_version: str, platform: str | None = None) -> Runtime | None:
    """The registered runtime of this pair (on ``platform``, when given)."""
    for runtime in RUNTIMES:
        if (runtime.distribution, runtime.torch) == (distribution, torch_version) and (
            platform is None or platform in runtime.platforms
        ):
            return runtime
    return None


def registered_pairs(platform: str | None = None) -> str:
    return ", ".join(
        f"{r.distribution}/{r.torch}"
        for r in RUNTIMES
        if platform is None or platform in r.platforms
    )


def require(distribution: str | None, torch_version: str | None = None) -> None:
    """Check what can be checked: the distribution alone, or the exact pair once torch is imported."""
    if distribution is None:
        raise UnsupportedRuntime(
            f"torch is not installed: install the CPU wheel with python -m pip install "
            f"torch=={DEFAULT_TORCH_VERSION} --index-url {CPU_INDEX}"
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
        f"unregistered torch runtime {installed} (distribution/torch.__version__); "
        f"registered: {registered_pairs(here)} (on {here}); install torch=={DEFAULT_TORCH_VERSION} "
        f"from {CPU_INDEX}"
    )
