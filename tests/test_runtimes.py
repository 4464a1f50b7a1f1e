"""The registered runtimes: exact pairs, per platform, as each measured wheel reports itself."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from dcp_invariant import errors, runtimes, wheels

HERE = [r for r in runtimes.RUNTIMES if sys.platform in r.platforms]
ENTRIES = wheels.load()
# Every release from 2.11 to the current one (October 2026).
RELEASES = ("2.11.0", "2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1", "2.15.0")


@pytest.mark.parametrize("registered", HERE, ids=lambda r: f"{r.distribution}/{r.torch}")
def test_registered_pairs_are_found_and_required(registered: runtimes.Runtime) -> None:
    assert runtimes.find(registered.distribution, registered.torch, sys.platform) is registered
    runtimes.require(registered.distribution, registered.torch)  # raises if refused
    # Before torch is imported only the distribution can be checked; that check passes.
    runtimes.require(registered.distribution)


def test_find_requires_the_exact_pair() -> None:
    assert runtimes.find("2.13.0+cpu", "2.11.0+cpu") is None


def test_the_registry_is_the_recorded_wheels() -> None:
    """RUNTIMES holds exactly the pairs of runtimes.json, each with its release's digest."""
    for entry in ENTRIES:
        runtime = runtimes.find(entry.distribution, entry.torch, entry.sys_platform)
        assert runtime is not None, entry
        assert (
            runtime.release,
            runtime.create_tcp_store_bytes,
            runtime.create_tcp_store_sha256,
        ) == (entry.release, entry.create_tcp_store_bytes, entry.create_tcp_store_sha256)
    pairs = {(e.distribution, e.torch, e.sys_platform) for e in ENTRIES}
    assert {(r.distribution, r.torch, p) for r in runtimes.RUNTIMES for p in r.platforms} == pairs


def test_every_release_is_registered_on_every_platform_in_both_builds() -> None:
    have = [(e.release, e.target, e.build) for e in ENTRIES]
    want = {(r, t.name, b) for r in RELEASES for t in wheels.TARGETS for b in ("pypi", "cpu-index")}
    assert sorted(have) == sorted(want)
    assert runtimes.releases() == list(RELEASES)


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"{e.release}-{e.target}-{e.build}")
def test_each_entry_is_what_its_wheel_says(entry: wheels.Entry) -> None:
    tags = {"linux-x86_64": "manylinux", "linux-aarch64": "manylinux", "windows-x64": "win_amd64"}
    assert entry.wheel.startswith(f"torch-{entry.distribution}-cp311-cp311-")
    assert tags.get(entry.target, "macosx_") in entry.wheel
    assert entry.wheel.endswith(
        {"linux-aarch64": "_aarch64.whl", "macos-arm64": "_arm64.whl"}.get(entry.target, ".whl")
    )
    assert entry.distribution.split("+")[0] == entry.torch.split("+")[0] == entry.release
    if entry.measured:
        assert entry.wheel_sha256 is not None and len(entry.wheel_sha256) == 64
    else:
        # Only the CPU index's wheels, which cannot be fetched here, are derived.
        assert entry.build == "cpu-index" and entry.wheel_sha256 is None


@pytest.mark.parametrize("release", RELEASES)
def test_every_wheel_of_a_release_has_one_guarded_source(release: str) -> None:
    sources = {
        (e.create_tcp_store_bytes, e.create_tcp_store_sha256)
        for e in ENTRIES
        if e.release == release
    }
    assert len(sources) == 1, sources


def test_no_pair_means_two_things_on_one_platform() -> None:
    seen: dict[tuple[str, str, str], str] = {}
    for e in ENTRIES:
        key = (e.distribution, e.torch, e.sys_platform)
        assert seen.setdefault(key, e.release) == e.release, key


def test_macos_wheels_report_the_plain_version_and_linux_ones_a_build_suffix() -> None:
    # pytorch/pytorch#110791: macOS wheels carry no +cpu suffix; PyPI's Linux ones are CUDA.
    assert runtimes.find("2.13.0", "2.13.0", "darwin") is not None
    assert runtimes.find("2.13.0", "2.13.0", "linux") is None
    assert runtimes.find("2.13.0+cpu", "2.13.0+cpu", "win32") is not None


def test_torch_not_installed_is_named() -> None:
    with pytest.raises(errors.UnsupportedRuntime, match="torch is not installed"):
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
    with pytest.raises(errors.UnsupportedRuntime) as info:
        runtimes.require(distribution, version)

    message = str(info.value)
    assert f"unregistered torch runtime {installed}" in message
    assert f"registered releases: {', '.join(RELEASES)}" in message
    assert "python -m dcp_invariant.wheels RELEASE" in message
    assert "\n" not in message


# The page that holds the release table (the README points to it).
SUPPORTED_TORCH = Path(__file__).resolve().parents[1] / "docs" / "supported-torch.md"
_OS_TARGETS = {
    "Linux x86_64, aarch64": ("linux-x86_64", "linux-aarch64"),
    "Windows x64": ("windows-x64",),
    "macOS arm64": ("macos-arm64",),
}


def test_the_docs_table_is_the_registry() -> None:
    """Each row of the release table in docs/supported-torch.md says what the registered wheels
    report."""
    text = SUPPORTED_TORCH.read_text(encoding="utf-8")
    section = text[text.index("# Supported torch releases") :]
    rows = re.findall(r"^\| ([^|]+) \| ([^|]+) \| ([^|]+) \| ([^|]+) \|$", section, re.MULTILINE)
    entries = {(e.release, e.target, e.build): e for e in ENTRIES}
    said: set[tuple[str, str, str]] = set()
    builds: tuple[tuple[wheels.Build, int], ...] = (("pypi", 2), ("cpu-index", 3))
    for row in rows[1:]:  # after the header (the rule has no spaces)
        releases, os_name = row[0], row[1]
        named = list(RELEASES) if releases.strip() == "all seven" else releases.split(", ")
        for release in named:
            for target in _OS_TARGETS[os_name.strip()]:
                for build, column in builds:
                    pair = re.findall(r"`([^`]+)`", row[column])
                    entry = entries[(release.strip(), target, build)]
                    expected = [p.replace("X", release.strip()) for p in pair]
                    assert [entry.distribution, entry.torch] == expected, (release, target, build)
                    said.add((release.strip(), target, build))
    assert said == set(entries)
