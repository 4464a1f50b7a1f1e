"""An exclusive, advisory lock on a file in the store root, held while the store is changed.

POSIX: ``flock``, which belongs to the open file description, so two opens conflict even within
one process, and the kernel drops it when its holder dies (flock(2)). Windows: ``msvcrt.locking``
of the file's first byte, which the system likewise releases when the process ends
(``_locking`` in the Microsoft C runtime documentation). Either way a crashed holder never
leaves the store locked, and the lock file itself is never removed: removing it would let two
processes lock two different files of the same name.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dcp_invariant import regular_file
from dcp_invariant.commit.errors import StoreError

if sys.platform == "win32":
    import msvcrt

    def try_lock(fd: int) -> bool:
        """Take the lock without waiting; ``False`` if another process holds it."""
        os.lseek(fd, 0, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            return False
        return True

    def unlock(fd: int) -> None:
        os.lseek(fd, 0, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def try_lock(fd: int) -> bool:
        """Take the lock without waiting; ``False`` if another process holds it."""
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    def unlock(fd: int) -> None:
        fcntl.flock(fd, fcntl.LOCK_UN)


@contextmanager
def exclusive(path: Path, timeout: float) -> Iterator[None]:
    """Hold the lock on ``path`` (created if absent) for the body; give up after ``timeout`` s.

    Polls instead of blocking so that a holder that hangs is reported, not waited for forever.
    """
    try:
        fd = os.open(
            path,
            os.O_RDWR
            | os.O_CREAT
            | regular_file.NOFOLLOW
            | regular_file.NONBLOCK
            | regular_file.BINARY,
            0o644,
        )
    except OSError as exc:
        raise StoreError(f"{path.name}: cannot open the store's lock file ({exc})") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise StoreError(f"{path.name} is a {regular_file.kind(mode)}, not a regular file")
        deadline = time.monotonic() + timeout
        delay = 0.001
        while not try_lock(fd):
            if time.monotonic() >= deadline:
                raise StoreError(
                    f"{path.name}: another process has held the store's lock for over "
                    f"{timeout:g} s; if it is stuck, stop it and try again"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        try:
            yield
        finally:
            unlock(fd)
    finally:
        os.close(fd)
