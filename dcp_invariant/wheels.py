"""torch wheels, measured: the pair each reports and the digest of the function the guard patches.

``python -m dcp_invariant.wheels 2.16.0`` registers a release: it downloads that release's
wheel from PyPI for every platform PyTorch publishes (``pip download --no-deps
--only-binary=:all: --platform ...``, with no pip configuration), reads from each file what an installed copy would
report (the distribution's version, ``torch.__version__``) and the source of
``_create_tcp_store`` in ``torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py``
(what the torchrun guard requires before it patches anything), and records them, with the
wheel's file name and SHA-256, in ``runtimes.json`` next to this module. Review the diff and
commit it; :mod:`dcp_invariant.runtimes` reads that file and nothing else.

PyTorch's CPU index (https://download.pytorch.org/whl/cpu) serves each release's CPU build too.
Where it cannot be reached, its entries are derived: the pair its wheels report (``X+cpu``,
``X+cpu``; macOS wheels carry no suffix, pytorch/pytorch#110791) and the guarded source of
the same release's PyPI wheel, marked ``"measured": false``. ``--cpu-index`` measures those
wheels too, where the index can be reached (the GitHub CI does: ``--check``).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from dcp_invariant.errors import Error
from dcp_invariant.runtimes import CPU_INDEX, REGISTRY_FILE, release_key

GUARDED_MODULE = "torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py"
GUARDED_FUNCTION = "_create_tcp_store"
# The interpreter the wheels are fetched for: neither the pair nor the source differs by
# CPython version, and 3.11 is the oldest the package supports.
PYTHON = "3.11"
DOWNLOAD_TIMEOUT = 1800

Build = Literal["pypi", "cpu-index"]


@dataclass(frozen=True)
class Target:
    """A platform PyTorch publishes wheels for."""

    name: str  # e.g. linux-x86_64
    platform_tag: str  # what pip download --platform is given
    sys_platform: str  # sys.platform where such a wheel installs


TARGETS = (
    Target("linux-x86_64", "manylinux_2_28_x86_64", "linux"),
    Target("linux-aarch64", "manylinux_2_28_aarch64", "linux"),
    Target("windows-x64", "win_amd64", "win32"),
    Target("macos-arm64", "macosx_14_0_arm64", "darwin"),
)


@dataclass(frozen=True)
class Entry:
    """One registered wheel: what it reports, and what the guard requires of it."""

    release: str  # e.g. 2.15.0
    target: str  # Target.name
    sys_platform: str
    build: Build
    distribution: str  # importlib.metadata.version("torch")
    torch: str  # torch.__version__
    create_tcp_store_bytes: int
    create_tcp_store_sha256: str
    wheel: str  # the file name
    wheel_sha256: str | None  # None where the wheel was not measured
    measured: bool  # False: derived from the PyPI wheel of the release (see module docstring)


class WheelError(Error, ValueError):
    """A file is not a torch wheel this module can read."""


@dataclass(frozen=True)
class Measurement:
    distribution: str
    torch: str
    source_bytes: int
    source_sha256: str


def guarded_source(module_source: str) -> str:
    """``inspect.getsource`` of the guarded function, from its module's text.

    inspect takes the function's lines from its first decorator (or ``def``) to the end of its
    block; ``ast`` gives the same lines without importing anything. inspect reads the file with
    universal newlines (``linecache`` opens it with ``tokenize.open``), so the CRLF line ends of
    the Windows wheels' sources are LF in what it returns, as here.
    """
    module_source = module_source.replace("\r\n", "\n").replace("\r", "\n")
    tree = ast.parse(module_source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == GUARDED_FUNCTION:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            assert node.end_lineno is not None
            lines = module_source.splitlines(keepends=True)
            return "".join(lines[first - 1 : node.end_lineno])
    raise WheelError(f"{GUARDED_MODULE} has no top-level {GUARDED_FUNCTION}")


def measure(wheel: Path) -> Measurement:
    """Read a torch wheel: its version, ``torch.__version__`` and the guarded source's digest."""
    try:
        archive = zipfile.ZipFile(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise WheelError(f"{wheel.name}: not a wheel ({exc})") from None
    with archive:
        names = archive.namelist()
        metadata = [n for n in names if re.fullmatch(r"torch-[^/]+\.dist-info/METADATA", n)]
        if len(metadata) != 1 or "torch/version.py" not in names or GUARDED_MODULE not in names:
            raise WheelError(f"{wheel.name}: not a torch wheel")
        header = archive.read(metadata[0]).decode("utf-8")
        match = re.search(r"^Version: (\S+)$", header, re.MULTILINE)
        if match is None:
            raise WheelError(f"{wheel.name}: METADATA names no version")
        version = _version_py(archive.read("torch/version.py").decode("utf-8"))
        source = guarded_source(archive.read(GUARDED_MODULE).decode("utf-8")).encode("utf-8")
    return Measurement(match[1], version, len(source), hashlib.sha256(source).hexdigest())


def _version_py(text: str) -> str:
    for node in ast.parse(text).body:
        if (
            isinstance(node, ast.Assign)
            and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["__version__"]
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    raise WheelError("torch/version.py sets no __version__ string")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(release: str, target: Target, directory: Path, index: str | None = None) -> Path:
    """``pip download`` the release's cp311 wheel for ``target`` into ``directory``.

    pip runs with no configuration at all: no file (PIP_CONFIG_FILE set to the null device) and
    no PIP_* variable. ``--isolated`` is not enough: it still reads the site-wide files, where a
    machine may cap torch or add a find-links directory whose local CPU wheel pip would prefer
    to PyPI's (its ``+cpu`` local version sorts above the plain one).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
        "--only-binary=:all:", "--platform", target.platform_tag, "--python-version", PYTHON,
        "--implementation", "cp", "--abi", "cp" + PYTHON.replace(".", ""),
        "--dest", str(directory), f"torch=={release}",
    ]  # fmt: skip
    if index is not None:
        command += ["--index-url", index]
    before = set(directory.glob("torch-*.whl"))
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT, check=False, env=env
    )
    new = sorted(set(directory.glob("torch-*.whl")) - before)
    if done.returncode != 0 or len(new) != 1:
        said = [line for line in done.stderr.splitlines() if line.startswith("ERROR")]
        raise WheelError(
            f"pip download torch=={release} for {target.name}: "
            f"{said[0] if said else f'exit {done.returncode}, {len(new)} wheels'}"
        )
    return new[0]


def entry_from_wheel(release: str, target: Target, build: Build, wheel: Path) -> Entry:
    m = measure(wheel)
    return Entry(
        release, target.name, target.sys_platform, build, m.distribution, m.torch,
        m.source_bytes, m.source_sha256, wheel.name, file_sha256(wheel), measured=True,
    )  # fmt: skip


def cpu_index_entry(pypi: Entry, target: Target) -> Entry:
    """The CPU index's wheel of ``pypi``'s release, derived from the PyPI wheel (unmeasured)."""
    # macOS wheels carry no +cpu (pytorch/pytorch#110791).
    version = pypi.release if target.sys_platform == "darwin" else f"{pypi.release}+cpu"
    tags = pypi.wheel.split("-", 2)[2]  # cp311-cp311-<platform>.whl
    return Entry(
        pypi.release, target.name, target.sys_platform, "cpu-index", version, version,
        pypi.create_tcp_store_bytes, pypi.create_tcp_store_sha256,
        f"torch-{version}-{tags}", None, measured=False,
    )  # fmt: skip


def load(path: Path = REGISTRY_FILE) -> list[Entry]:
    records = json.loads(path.read_text(encoding="utf-8"))["wheels"]
    return [Entry(**r) for r in records]


def save(entries: Sequence[Entry], path: Path = REGISTRY_FILE) -> None:
    ordered = sorted(entries, key=lambda e: (release_key(e.release), e.target, e.build))
    text = json.dumps(
        {
            "about": (
                "Written by `python -m dcp_invariant.wheels RELEASE`: each torch wheel's reported "
                "pair and the digest of the source the torchrun guard patches. Do not edit."
            ),
            "wheels": [asdict(e) for e in ordered],
        },
        indent=1,
        sort_keys=True,
    )
    path.write_text(text + "\n", encoding="utf-8", newline="\n")


def register(
    release: str, directory: Path, cpu_index: bool = False, local: Sequence[Path] = ()
) -> list[Entry]:
    """Every wheel of ``release``: PyPI's, and the CPU index's, measured where it can be had
    (downloaded with ``cpu_index``, or a file of that name in a ``local`` directory), else
    derived from PyPI's."""
    out = []
    for target in TARGETS:
        pypi = entry_from_wheel(release, target, "pypi", download(release, target, directory))
        out.append(pypi)
        derived = cpu_index_entry(pypi, target)
        copies = [d / derived.wheel for d in local if (d / derived.wheel).is_file()]
        if cpu_index:
            wheel = download(release, target, directory, CPU_INDEX)
            out.append(entry_from_wheel(release, target, "cpu-index", wheel))
        elif copies:
            out.append(entry_from_wheel(release, target, "cpu-index", copies[0]))
        else:
            out.append(derived)
        for wheel in directory.glob("torch-*.whl"):
            wheel.unlink()  # hundreds of MB each: one at a time
    return out


def check_cpu_index(releases: Sequence[str], directory: Path) -> list[Entry]:
    """The CPU index's wheels of ``releases``, measured: what the derived entries claim."""
    out = []
    for release in releases:
        print(f"torch {release} ({CPU_INDEX})", file=sys.stderr, flush=True)
        for target in TARGETS:
            wheel = download(release, target, directory, CPU_INDEX)
            out.append(entry_from_wheel(release, target, "cpu-index", wheel))
            wheel.unlink()
    return out


def agrees(recorded: Entry | None, fresh: Entry) -> bool:
    """Whether a wheel measured again says what was recorded: the pair, the guarded source and
    the file name, and the file's digest where the recorded entry was measured."""
    if recorded is None:
        return False
    same = (
        (recorded.distribution, recorded.torch, recorded.wheel)
        == (fresh.distribution, fresh.torch, fresh.wheel)
        and recorded.create_tcp_store_bytes == fresh.create_tcp_store_bytes
        and recorded.create_tcp_store_sha256 == fresh.create_tcp_store_sha256
    )
    return same and (not recorded.measured or recorded.wheel_sha256 == fresh.wheel_sha256)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dcp_invariant.wheels",
        description="Register torch releases: measure their wheels into runtimes.json.",
    )
    parser.add_argument("releases", nargs="*", help="e.g. 2.16.0 (default: every registered one)")
    parser.add_argument(
        "--cpu-index",
        action="store_true",
        help=f"also download the CPU build from {CPU_INDEX} instead of deriving it",
    )
    parser.add_argument(
        "--local",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a directory of CPU-index wheels to measure instead of deriving them (repeatable)",
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help=(
            "measure again and exit 1 where a wheel differs from runtimes.json; write nothing. "
            "With --cpu-index, only the CPU index's wheels are fetched and checked"
        ),
    )
    args = parser.parse_args(argv)
    recorded = load()
    releases = args.releases or sorted({e.release for e in recorded}, key=release_key)
    fresh: list[Entry] = []
    with tempfile.TemporaryDirectory(prefix="dcp-invariant-wheels-") as tmp:
        if args.check and args.cpu_index:
            fresh = check_cpu_index(releases, Path(tmp))
            releases = []
        for release in releases:
            print(f"torch {release}", file=sys.stderr, flush=True)
            measured = register(release, Path(tmp), args.cpu_index, args.local)
            fresh += measured
            if not args.check:  # each release as it is measured: a later failure keeps it
                recorded = [e for e in recorded if e.release != release] + measured
                save(recorded)
    if args.check:
        known = {(e.release, e.target, e.build): e for e in recorded}
        differ = [e for e in fresh if not agrees(known.get((e.release, e.target, e.build)), e)]
        for e in differ:
            print(f"differs: {e.release} {e.target} {e.build}: {asdict(e)}", file=sys.stderr)
        return 1 if differ else 0
    print(f"{REGISTRY_FILE.name}: {len(recorded)} wheels", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
