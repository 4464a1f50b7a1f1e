"""The registered runtimes: exact pairs, per platform, as each CPU wheel reports itself."""

from __future__ import annotations

import sys

import pytest

from dcp_invariant import runtimes

HERE = [r for r in runtimes.RUNTIMES if sys.platform in r.platforms]


@pytest.mark.parametrize("registered", HERE, ids=lambda r: f"{r.distribution}/{r.torch}")
def test_registered_pairs_are_found_and_required(registered: runtimes.Runtime) -> None:
    assert runtimes.find(registered.distribution, registered.torch, sys.platform) is registered
    runtimes.require(registered.distribution, registered.torch)  # raises if refused
    # Before torch is imported only the distribution can be checked; that check passes.
    runtimes.require(registered.distribution)


def test_find_requires_the_exact_pair() -> None:
    assert runtimes.find("2.13.0+cpu", "2.11.0+cpu") is None


def test_every_registered_release_has_a_pair_for_each_runner_os() -> None:
    releases = {r.create_tcp_store_sha256 for r in runtimes.RUNTIMES}
    for digest in releases:
        covered = {
            p for r in runtimes.RUNTIMES if r.create_tcp_store_sha256 == digest for p in r.platforms
        }
        assert covered >= {"linux", "win32", "darwin"}, digest


def test_macos_wheels_report_the_plain_version_and_linux_ones_the_cpu_suffix() -> None:
    # pytorch/pytorch#110791: macOS (and ARM) wheels carry no +cpu suffix.
    assert runtimes.find("2.13.0", "2.13.0", "darwin") is not None
    assert runtimes.find("2.13.0", "2.13.0", "linux") is None  # PyPI's Linux 2.13.0 is CUDA
    assert runtimes.find("2.13.0+cpu", "2.13.0+cpu", "win32") is not None


def test_torch_not_installed_is_named() -> None:
    with pytest.raises(runtimes.UnsupportedRuntime, match="torch is not installed"):
        runtimes.require(None)


@pytest.mark.parametrize(
    ("distribution", "version", "installed"),
    [
        ("9.9.9", None, "9.9.9/(not imported)"),
        ("9.9.9", "9.9.9", "9.9.9/9.9.9"),
        ("2.13.0+cpu", "2.11.0+cpu", "2.13.0+cpu/2.11.0+cpu"),  # each half registered, not the pair
    ],
)
def test_require_names_the_installed_and_registered_pairs(
    distribution: str, version: str | None, installed: str
) -> None:
    with pytest.raises(runtimes.UnsupportedRuntime) as info:
        runtimes.require(distribution, version)

    message = str(info.value)
    assert f"unregistered torch runtime {installed}" in message
    for registered in HERE:
        assert f"{registered.distribution}/{registered.torch}" in message
    assert "\n" not in message
