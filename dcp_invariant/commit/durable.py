"""Writing files so that a reader sees the old content or the new, never a mix, and it survives a crash.

A "latest" pointer moved before its data was durable is a reported field failure
(KempnerInstitute/KempnerForge #102), so the order is fixed: temp file in the same directory,
write, fsync, ``os.replace``, fsync of the directory.

Reads refuse anything but a regular file without opening it first: ``open()`` of a FIFO blocks
until a writer appears (fifo(7)), so a FIFO planted at ``pointer.json`` would hang every load.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import stat
from pathlib import Path

from dcp_invariant.commit.errors import StoreError

# Flags the platform may lack (Windows has neither FIFOs nor O_NOFOLLOW): 0 leaves them out.
# O_BINARY matters on Windows only, where os.open defaults to text mode.
NOFOLLOW: int = getattr(os, "O_NOFOLLOW", 0)
NONBLOCK: int = getattr(os, "O_NONBLOCK", 0)
BINARY: int = getattr(os, "O_BINARY", 0)
# A temporary is ".<final name>.<16 hex>.tmp" beside its final name: a crash between creating it
# and the rename leaves it behind, and the name alone says whose it is and what it was for.
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{16}\.tmp")


def temporary_target(name: str) -> str | None:
    """The final name a temporary of :func:`replace_file` was written for, else ``None``."""
    match = _TEMPORARY.fullmatch(name)
    return None if match is None else match["name"]


def replace_file(path: Path, data: bytes) -> None:
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
    # O_EXCL and O_NOFOLLOW: never write through something planted under the temporary's name.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | BINARY, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync(path.parent)


def read_bytes(path: Path, shown: str) -> bytes | None:
    """The content of the regular file ``path``; ``None`` if absent; a one-line error otherwise.

    ``shown`` names the file in the error. ``lstat`` first, then an open that neither follows a
    symlink nor waits for a FIFO's writer, then ``fstat`` of what was opened, in case the entry
    was swapped between the two.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError as exc:
        raise StoreError(f"{shown}: {path.parent} is not a directory") from exc
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"{shown} is a {kind(st.st_mode)}, not a regular file; remove it")
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW | NONBLOCK | BINARY)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError(f"{shown} is a {kind(st.st_mode)}, not a regular file; remove it")
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def fsync(path: Path) -> None:
    """Flush a file's data, or a directory's entries (a rename), to disk.

    Windows can open neither a directory nor a read-only file for FlushFileBuffers; NTFS
    journals the metadata a rename needs, so there is nothing to do there.
    """
    if os.name == "nt":
        return
    # Non-blocking, so a FIFO swapped in for a checked file cannot hang the open.
    fd = os.open(path, os.O_RDONLY | NONBLOCK)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def kind(mode: int) -> str:
    """What kind of directory entry ``mode`` describes, in words."""
    for test, name in (
        (stat.S_ISREG, "regular file"),
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    ):
        if test(mode):
            return name
    return "non-regular file"
