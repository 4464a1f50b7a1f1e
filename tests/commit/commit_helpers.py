"""What the commit-protocol tests share: DCP-shaped candidates, committing them, crash injection."""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from dcp_invariant.commit import CheckpointStore, Generation

SHARD0 = "__0_0.distcp"
SHARD1 = "__1_0.distcp"


def dcp_files(tag: str) -> dict[str, bytes]:
    return {
        ".metadata": f"metadata for {tag}".encode(),
        SHARD0: f"rank 0 tensors of {tag}".encode() * 4,
        SHARD1: f"rank 1 tensors of {tag}".encode() * 4,
    }


def write_candidate(store: CheckpointStore, label: str) -> dict[str, bytes]:
    files = dcp_files(label)
    directory = store.candidate(label)
    directory.mkdir(parents=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return files


# An app's own save, as a framework writes it: files in subdirectories and a directory it made
# and left empty (CheckpointStore(marker=None) seals it).
NESTED_FILES = ("meta.json", "model/weights.pt", "optim/shards/__0_0.distcp")
NESTED_DIRECTORIES = ("empty", "model", "optim", "optim/shards")


def write_nested_candidate(store: CheckpointStore, label: str) -> dict[str, bytes]:
    files = {name: f"{name} of {label}".encode() * 3 for name in NESTED_FILES}
    directory = store.candidate(label)
    for sub in NESTED_DIRECTORIES:
        (directory / sub).mkdir(parents=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return files


def commit(store: CheckpointStore, label: str) -> Generation:
    """Write, seal and promote ``label``: DCP-shaped, or nested for a store without a marker."""
    (write_candidate if store.marker is not None else write_nested_candidate)(store, label)
    store.seal(label)
    return store.promote(label)


def flip_byte(path: Path, offset: int = 3) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def make_writable(path: Path) -> None:
    path.chmod(path.stat().st_mode | stat.S_IWUSR)


def temporaries(root: Path) -> list[str]:
    """Every ``*.tmp`` left anywhere under ``root``, relative to it."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.tmp"))


def symlink_or_skip(link: Path, target: Path) -> None:
    try:
        link.symlink_to(target, target_is_directory=target.is_dir())
    except OSError as exc:  # Windows without the symlink privilege
        pytest.skip(f"cannot create symlinks here: {exc}")


# --- crash injection ------------------------------------------------------------------------


class Crash(BaseException):
    """The process died here: no handler of the code under test may catch it."""


Mode = Literal["before", "after", "eio"]
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT
_HEX64 = re.compile(r"[0-9a-f]{64}")
_TOKEN = re.compile(r"\.[0-9a-f]{16}\.tmp$")


@dataclass
class Injector:
    """Counts the filesystem operations that change a store, and fails the ``at``-th one.

    ``before``: the process dies instead of performing it; ``after``: it is performed, then the
    process dies; ``eio``: it fails with EIO and the process lives on. Once dead, every further
    operation dies too, so no cleanup handler of the code under test can run, as in a real crash.
    Only operations on paths under ``root`` count; descriptors are mapped back to their paths.
    """

    root: Path
    at: int | None = None
    mode: Mode = "before"
    ops: list[tuple[str, str]] = field(default_factory=list)
    dead: bool = False
    fired: bool = False
    _paths: dict[int, str] = field(default_factory=dict)

    def describe(self, path: str) -> str | None:
        try:
            rel = Path(os.path.abspath(path)).relative_to(os.path.abspath(self.root))
        except ValueError:
            return None
        text = rel.as_posix()
        text = _HEX64.sub("<generation>", text)
        return _TOKEN.sub(".<random>.tmp", text)

    def operation(self, kind: str, path: str | None, call: Callable[[], Any]) -> Any:
        shown = None if path is None else self.describe(path)
        if shown is None:
            return call()
        if self.dead:
            raise Crash(f"already dead: {kind} {shown}")
        index = len(self.ops)
        self.ops.append((kind, shown))
        if index == self.at:
            self.fired = True
            if self.mode == "before":
                self.dead = True
                raise Crash(f"before {kind} {shown}")
            if self.mode == "eio":
                raise OSError(errno.EIO, "injected I/O error", shown)
        result = call()
        if index == self.at:
            self.dead = True
            if kind == "open for write":
                os.close(result)  # the kernel closes a dead process's descriptors
            raise Crash(f"after {kind} {shown}")
        return result

    @contextmanager
    def patched(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[Injector]:
        real = {
            name: getattr(os, name)
            for name in (
                "open",
                "write",
                "fsync",
                "replace",
                "rename",
                "chmod",
                "fchmod",
                "unlink",
                "remove",
                "mkdir",
                "rmdir",
            )
            if hasattr(os, name)
        }

        def open_(path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
            def call() -> int:
                fd: int = real["open"](path, flags, mode, **kw)
                self._paths[fd] = os.fspath(path)
                return fd

            if flags & _WRITE_FLAGS:
                return int(self.operation("open for write", os.fspath(path), call))
            return call()

        def by_fd(kind: str, name: str) -> Callable[..., Any]:
            return lambda fd, *a: self.operation(
                kind, self._paths.get(fd), lambda: real[name](fd, *a)
            )

        def by_path(kind: str, name: str, arg: int = 0) -> Callable[..., Any]:
            return lambda *a, **kw: self.operation(
                kind, os.fspath(a[arg]), lambda: real[name](*a, **kw)
            )

        wrappers: dict[str, Callable[..., Any]] = {
            "open": open_,
            "write": by_fd("write", "write"),
            "fsync": by_fd("fsync", "fsync"),
            "replace": by_path("replace", "replace", 1),
            "rename": by_path("rename", "rename", 1),
            "chmod": by_path("chmod", "chmod"),
            "fchmod": by_fd("chmod", "fchmod"),
            "unlink": by_path("unlink", "unlink"),
            "remove": by_path("unlink", "remove"),
            "mkdir": by_path("mkdir", "mkdir"),
            "rmdir": by_path("rmdir", "rmdir"),
        }
        with monkeypatch.context() as patch:
            for name in real:
                patch.setattr(os, name, wrappers[name])
            yield self
