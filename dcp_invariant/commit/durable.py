"""Writing files so that a reader sees the old content or the new, never a mix, and it survives a crash.

A "latest" pointer moved before its data was durable is a reported field failure
(KempnerInstitute/KempnerForge #102), so the order is fixed: temp file in the same directory,
write, fsync, ``os.replace``, fsync of the directory.

Reads go through :mod:`dcp_invariant.regular_file`, which refuses anything but a regular file
without waiting on it: a FIFO planted at ``pointer.json`` must not hang every load.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from pathlib import Path

from dcp_invariant import regular_file
from dcp_invariant.commit.errors import StoreError

# Pointers, receipts and lineage records: a receipt lists one line per checkpoint file, so even
# thousands of shards stay far below this.
MAX_RECORD_BYTES = 64 << 20
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
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | regular_file.NOFOLLOW | regular_file.BINARY,
        0o600,
    )
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

    ``shown`` names the file in the error. Every file this protocol reads is one it wrote, far
    below :data:`MAX_RECORD_BYTES`; anything larger was put there by someone else.
    """
    try:
        return regular_file.read(path, bound=MAX_RECORD_BYTES)
    except FileNotFoundError:
        return None
    except NotADirectoryError as exc:
        raise StoreError(f"{shown}: {path.parent} is not a directory") from exc
    except regular_file.NotRegularFile as exc:
        raise StoreError(f"{shown} is a {exc.kind}, not a regular file; remove it") from exc
    except regular_file.OverBound as exc:
        raise StoreError(
            f"{shown} is over {exc.bound} bytes, so this protocol did not write it; remove it"
        ) from exc


def fsync(path: Path) -> None:
    """Flush a file's data, or a directory's entries (a rename), to disk.

    Windows can open neither a directory nor a read-only file for FlushFileBuffers; NTFS
    journals the metadata a rename needs, so there is nothing to do there.
    """
    if os.name == "nt":
        return
    # Non-blocking, so a FIFO swapped in for a checked file cannot hang the open.
    fd = os.open(path, os.O_RDONLY | regular_file.NONBLOCK)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
