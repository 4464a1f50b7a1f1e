"""Measuring a torch wheel (dcp_invariant/wheels.py) without installing or importing it."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import zipfile
from pathlib import Path

import local_torch_index
import pytest

from dcp_invariant import wheels

MODULE = '''"""A module shaped like torch's c10d_rendezvous_backend."""
import functools


def before():
    pass


@functools.lru_cache
def _create_tcp_store(params):  # the guarded function
    host = params

    # a comment inside the block
    return host


def after():
    pass
'''


def fake_wheel(path: Path, module: str, version: str = "9.9.9+cpu") -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(
            "torch-9.9.9.dist-info/METADATA", "Metadata-Version: 2.1\nName: torch\nVersion: 9.9.9\n"
        )
        z.writestr("torch/version.py", f"__version__ = '{version}'\ngit_version = 'abc'\n")
        z.writestr(wheels.GUARDED_MODULE, module)
    return path


def inspected(tmp_path: Path, module: str) -> str:
    """What inspect.getsource gives for the function, the module imported for real."""
    file = tmp_path / "guarded_module.py"
    file.write_bytes(module.encode())
    spec = importlib.util.spec_from_file_location("guarded_module", file)
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return inspect.getsource(loaded._create_tcp_store)


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_the_source_is_what_inspect_returns(tmp_path: Path, newline: str) -> None:
    module = MODULE.replace("\n", newline)  # Windows wheels carry CRLF sources
    expected = inspected(tmp_path, module)
    assert expected.startswith("@functools.lru_cache\ndef _create_tcp_store")
    assert wheels.guarded_source(module) == expected


def test_a_wheel_reports_its_pair_and_digest(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path / "torch-9.9.9-cp311-cp311-win_amd64.whl", MODULE)
    source = inspected(tmp_path, MODULE).encode()
    assert wheels.measure(wheel) == wheels.Measurement(
        "9.9.9", "9.9.9+cpu", len(source), hashlib.sha256(source).hexdigest()
    )


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "not a wheel"),
        ("x = 1\n", "has no top-level _create_tcp_store"),
    ],
)
def test_what_is_not_a_torch_wheel_is_refused(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    path = tmp_path / "torch-9.9.9-cp311-cp311-win_amd64.whl"
    if content is None:
        path.write_bytes(b"not a zip")
    else:
        fake_wheel(path, content)
    with pytest.raises(wheels.WheelError, match=problem):
        wheels.measure(path)


def test_a_cpu_index_entry_is_derived_from_the_pypi_wheel() -> None:
    pypi = wheels.Entry(
        "2.15.0", "linux-x86_64", "linux", "pypi", "2.15.0", "2.15.0+cu132", 2191, "a" * 64,
        "torch-2.15.0-cp311-cp311-manylinux_2_28_x86_64.whl", "b" * 64, True,
    )  # fmt: skip
    linux = wheels.TARGETS[0]
    derived = wheels.cpu_index_entry(pypi, linux)
    assert (derived.distribution, derived.torch, derived.build) == (
        "2.15.0+cpu",
        "2.15.0+cpu",
        "cpu-index",
    )
    assert derived.wheel == "torch-2.15.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert (derived.create_tcp_store_sha256, derived.wheel_sha256, derived.measured) == (
        "a" * 64,
        None,
        False,
    )
    mac = next(t for t in wheels.TARGETS if t.sys_platform == "darwin")
    assert wheels.cpu_index_entry(pypi, mac).torch == "2.15.0"  # no +cpu on macOS


def test_the_machines_own_cpu_wheels_match_the_registry() -> None:
    """This machine's CPU-index wheels (pip's find-links) are measured for real here."""
    found = [w.path for w in local_torch_index.local_wheels()]
    if not found:
        pytest.skip("no CPU-index torch wheel on this machine")
    registry = {(e.wheel, e.build): e for e in wheels.load()}
    for wheel in found:
        entry = registry[(wheel.name, "cpu-index")]
        m = wheels.measure(wheel)
        assert (m.distribution, m.torch) == (entry.distribution, entry.torch)
        assert (m.source_bytes, m.source_sha256) == (
            entry.create_tcp_store_bytes,
            entry.create_tcp_store_sha256,
        )


def test_a_measured_wheel_agrees_with_its_derived_entry_only_when_it_says_the_same() -> None:
    pypi = wheels.Entry(
        "2.15.0", "windows-x64", "win32", "pypi", "2.15.0", "2.15.0+cpu", 2191, "a" * 64,
        "torch-2.15.0-cp311-cp311-win_amd64.whl", "b" * 64, True,
    )  # fmt: skip
    derived = wheels.cpu_index_entry(pypi, wheels.TARGETS[2])
    measured = wheels.Entry(**{**derived.__dict__, "wheel_sha256": "c" * 64, "measured": True})
    assert wheels.agrees(derived, measured)  # a derived entry records no file digest
    # The v0.2.0 mistake: the CPU wheel reports another distribution than was assumed.
    other = wheels.Entry(**{**measured.__dict__, "distribution": "2.15.0"})
    assert not wheels.agrees(derived, other)
    assert not wheels.agrees(None, measured)
    # A measured entry must match the file too.
    assert not wheels.agrees(
        measured, wheels.Entry(**{**measured.__dict__, "wheel_sha256": "d" * 64})
    )
