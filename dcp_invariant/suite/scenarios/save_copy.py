"""Copying what a group's saves left, for a scenario of its own: by kind, holes kept, interruptible.

What an app's own save wrote is the user's: it may hold a FIFO, a socket or a device node, which
``shutil.copy2`` would open and read (a FIFO blocks until a writer comes, ``/dev/zero`` never
ends, ``/dev/null`` reads as an empty regular file, so a device would be sealed as one). So every
entry's kind is taken with ``lstat`` before a byte is read, as the commit store's seal does
(:func:`dcp_invariant.commit.receipt.seal`): a regular file is copied, a directory made, a
symlink copied as a link (the seal refuses it, and a copy must not hide it), and anything else is
left out and returned, for the scenario's commit to refuse in the seal's own words.

A regular file is copied in chunks of :data:`~dcp_invariant.regular_file.CHUNK_BYTES`, between
which :func:`~dcp_invariant.regular_file.check_interruption` may stop it, and only its data:
``lseek(SEEK_DATA/SEEK_HOLE)`` (lseek(2); CPython exposes both where the platform has them) skips
its holes, which the copy keeps, so a 2 GiB sparse file costs what its data does.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dcp_invariant import regular_file


@dataclass(frozen=True)
class Refused:
    """An entry the copy left out: its path relative to the copied root ("/" between
    segments), and its kind in the words of :func:`~dcp_invariant.regular_file.kind`."""

    path: str
    kind: str


def copy_tree(source: Path, target: Path) -> list[Refused]:
    """Copy the tree ``source`` to ``target`` (made, with its parents); what it left out, in
    the order met (name order, depth first). A failure keeps its errno: a full disk stops the
    run (exit 2) rather than failing one scenario."""
    refused: list[Refused] = []
    pending = [""]
    while pending:
        rel = pending.pop()
        (target / rel).mkdir(parents=True, exist_ok=True)
        with os.scandir(source / rel) as it:
            entries = sorted(it, key=lambda e: e.name, reverse=True)
        for entry in entries:
            inner = f"{rel}/{entry.name}" if rel else entry.name
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                pending.append(inner)
            elif stat.S_ISLNK(mode):
                os.symlink(os.readlink(entry.path), target / inner)
            elif not stat.S_ISREG(mode):
                refused.append(Refused(inner, regular_file.kind(mode)))
            else:
                try:
                    copy_file(Path(entry.path), target / inner)
                except regular_file.NotRegularFile as exc:  # swapped since its lstat
                    refused.append(Refused(inner, exc.kind))
    return sorted(refused, key=lambda r: r.path)


def copy_file(source: Path, target: Path, length: int | None = None) -> None:
    """Copy the regular file ``source`` to the new file ``target``, its holes kept; with
    ``length``, only its first ``length`` bytes. Its mode and (whole) its times are kept, so
    that the copy's ``lstat`` is the source's (:mod:`dcp_invariant.commit.after_save`).

    Raises :class:`~dcp_invariant.regular_file.NotRegularFile` if what it opened is not a
    regular file, never having read from it."""
    fd = os.open(source, os.O_RDONLY | regular_file.NOFOLLOW | regular_file.NONBLOCK | _BINARY)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise regular_file.NotRegularFile(source, regular_file.kind(st.st_mode))
        size = st.st_size if length is None else min(length, st.st_size)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | regular_file.NOFOLLOW | _BINARY
        out = os.open(target, flags, 0o600)
        try:
            for start, end in _extents(fd, size):
                _copy_range(fd, out, start, end)
            os.ftruncate(out, size)  # the holes at the end, which nothing was written into
        finally:
            os.close(out)
    finally:
        os.close(fd)
    os.chmod(target, stat.S_IMODE(st.st_mode))
    if length is None:
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))


_BINARY = regular_file.BINARY


def _extents(fd: int, size: int) -> Iterator[tuple[int, int]]:
    """The ``(start, end)`` ranges of ``fd``'s first ``size`` bytes that hold data: the whole
    range where the platform cannot tell holes (no SEEK_DATA, as on Windows), or the file
    system does not (lseek(2): then it reports all of the file as data)."""
    seek_data = getattr(os, "SEEK_DATA", None)
    seek_hole = getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        yield 0, size
        return
    position = 0
    while position < size:
        regular_file.check_interruption()
        try:
            start = os.lseek(fd, position, seek_data)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                return  # no data at or after position: the rest is a hole
            if exc.errno == errno.EINVAL and position == 0:
                yield 0, size  # a kernel that does not know SEEK_DATA
                return
            raise
        if start >= size:
            return
        end = min(os.lseek(fd, start, seek_hole), size)
        yield start, end
        position = end


def _copy_range(fd: int, out: int, start: int, end: int) -> None:
    """Bytes ``start`` to ``end`` of ``fd`` to the same offsets of ``out``, a chunk at a time,
    the run's interruption checked before each."""
    position = start
    while position < end:
        regular_file.check_interruption()
        os.lseek(fd, position, os.SEEK_SET)
        chunk = os.read(fd, min(regular_file.CHUNK_BYTES, end - position))
        if not chunk:
            return  # the file shrank since its fstat
        os.lseek(out, position, os.SEEK_SET)
        view = memoryview(chunk)
        while view:
            view = view[os.write(out, view) :]
        position += len(chunk)
