"""Writing files so that a reader sees the old content or the new, never a mix, and it survives a crash.

A "latest" pointer moved before its data was durable is a reported field failure
(KempnerInstitute/KempnerForge #102), so the order is fixed: temp file in the same directory,
flush, fsync, ``os.replace``, fsync of the directory.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_file(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync(path.parent)


def fsync(path: Path) -> None:
    """Flush a file's data, or a directory's entries (a rename), to disk.

    Windows can open neither a directory nor a read-only file for FlushFileBuffers; NTFS
    journals the metadata a rename needs, so there is nothing to do there.
    """
    if os.name == "nt":
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
