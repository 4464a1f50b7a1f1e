"""Reading a file that must be a regular file: never through a symlink, never waiting on a FIFO,
never past a bound. The one reader of the commit protocol, the verifier and the action's report.

Each of them reads names an attacker or a crash may have replaced. ``open()`` of a FIFO blocks
until a writer appears (fifo(7)), so a FIFO planted at ``pointer.json`` would hang every load;
a symlink would read someone else's file. So: ``lstat`` first (Windows has no ``O_NOFOLLOW``),
then an open that neither follows a symlink nor waits, then ``fstat`` of what was opened, in case
the entry was swapped between the two; and a size bound checked before and while reading.
Standard library only: both sides of the package use it.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import Final

from dcp_invariant.errors import Error

# Flags the platform may lack (Windows has neither FIFOs nor O_NOFOLLOW): 0 leaves them out.
# O_BINARY matters on Windows only, where os.open defaults to text mode.
NOFOLLOW: Final[int] = getattr(os, "O_NOFOLLOW", 0)
NONBLOCK: Final[int] = getattr(os, "O_NONBLOCK", 0)
BINARY: Final[int] = getattr(os, "O_BINARY", 0)
CHUNK_BYTES: Final = 1 << 20
# What open(2) with O_NOFOLLOW gives for a symlink: ELOOP (Linux, macOS), EMLINK (FreeBSD),
# EFTYPE (NetBSD).
_SYMLINK_ERRNOS: Final = {errno.ELOOP, errno.EMLINK, getattr(errno, "EFTYPE", errno.ELOOP)}
# Called before every chunk a read or a copy takes: it raises to stop a long one (gigabytes a
# save wrote) when the run is being interrupted, which must stop within 2 s whatever a file's
# size. The runner sets it in each scenario's thread (a context variable: per thread, and none
# in the verifier or a worker, which a signal stops outright).
INTERRUPTION: ContextVar[Callable[[], None] | None] = ContextVar("interruption", default=None)


class NotRegularFile(Error, OSError):
    """The entry is a symlink, directory, FIFO, device or socket; ``kind`` says which."""

    def __init__(self, path: Path, kind: str) -> None:
        super().__init__(f"{path} is a {kind}, not a regular file")
        self.kind = kind


class OverBound(Error, OSError):
    """The file holds more than ``bound`` bytes; ``grew``: it did while it was being read."""

    def __init__(self, path: Path, bound: int, *, grew: bool) -> None:
        when = "grew past" if grew else "is over"
        super().__init__(f"{path} {when} the {bound}-byte bound")
        self.bound = bound
        self.grew = grew


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


def check_interruption() -> None:
    """Raise what :data:`INTERRUPTION` raises, if the run is being interrupted."""
    check = INTERRUPTION.get()
    if check is not None:
        check()


def chunks(path: Path, *, bound: int | None = None) -> Iterator[bytes]:
    """The content of the regular file ``path``, in chunks of at most :data:`CHUNK_BYTES`.

    Raises ``FileNotFoundError`` and the other ``OSError``\\ s of ``lstat``/``open``/``read``,
    :class:`NotRegularFile` and :class:`OverBound`. Memory does not grow with the file's size.
    """
    mode = os.lstat(path).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFile(path, kind(mode))
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW | NONBLOCK | BINARY)
    except OSError as exc:
        if exc.errno in _SYMLINK_ERRNOS and NOFOLLOW:
            raise NotRegularFile(path, "symlink") from exc
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(path, kind(st.st_mode))
        if bound is not None and st.st_size > bound:
            raise OverBound(path, bound, grew=False)
        size = 0
        # One byte past the bound is enough to know it was passed.
        want = CHUNK_BYTES if bound is None else min(CHUNK_BYTES, bound + 1)
        while True:
            check_interruption()
            chunk = os.read(fd, want)
            if not chunk:
                break
            size += len(chunk)
            if bound is not None and size > bound:
                raise OverBound(path, bound, grew=True)
            yield chunk
    finally:
        os.close(fd)


def read(path: Path, *, bound: int | None = None) -> bytes:
    """The whole content of the regular file ``path``; the errors of :func:`chunks`."""
    return b"".join(chunks(path, bound=bound))
