"""Loops whose own save writes what a checkpoint cannot hold, or keeps writing after it returned:
a FIFO, a socket, a device node, a large sparse file, a file a thread writes later. Each is
:mod:`saving_loops`' correct app otherwise, so any other failure is the tool's.

Workers import this module by name (``unsealable_loops:NAME``) from the tests directory.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
import threading
import time
from typing import Any

from saving_loops import SavesItself
from unsealable_names import (
    LATE,
    LATE_DELAY_SECONDS,
    SPARSE,
    SPARSE_BYTES,
    SPARSE_DATA,
    SPECIAL,
)

# The sockets a save bound: kept open until the process ends, as a server's would be.
_BOUND: list[socket.socket] = []


class SavesAFifo(SavesItself):
    def save(self, checkpoint_dir: str) -> None:
        super().save(checkpoint_dir)
        if sys.platform == "win32":  # POSIX only: skipped there
            raise NotImplementedError
        os.mkfifo(os.path.join(checkpoint_dir, SPECIAL))


class SavesASocket(SavesItself):
    def save(self, checkpoint_dir: str) -> None:
        super().save(checkpoint_dir)
        # Bound by the relative path (the worker works in its scenario's directory): an
        # absolute one may pass the 108 bytes sun_path holds (unix(7)).
        if sys.platform == "win32":  # POSIX only: skipped there
            raise NotImplementedError
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(os.path.join(checkpoint_dir, SPECIAL))
        _BOUND.append(server)


class SavesADevice(SavesItself):
    """Makes a character device node ``$UNSEALABLE_DEVICE`` (``major,minor``), as root in a
    container may (mknod(2) needs CAP_MKNOD)."""

    def save(self, checkpoint_dir: str) -> None:
        super().save(checkpoint_dir)
        if sys.platform == "win32":  # POSIX only: skipped there
            raise NotImplementedError
        major, minor = (int(n) for n in os.environ["UNSEALABLE_DEVICE"].split(","))
        os.mknod(
            os.path.join(checkpoint_dir, SPECIAL), stat.S_IFCHR | 0o600, os.makedev(major, minor)
        )


class SavesASparseFile(SavesItself):
    """Writes ``SPARSE_BYTES`` of which one block holds data: holes everywhere else."""

    def save(self, checkpoint_dir: str) -> None:
        super().save(checkpoint_dir)
        if self.rank != 0:
            return
        with open(os.path.join(checkpoint_dir, SPARSE), "wb") as f:
            f.seek(SPARSE_BYTES // 2)
            f.write(SPARSE_DATA)
            f.truncate(SPARSE_BYTES)


class WritesAfterSave(SavesItself):
    """Returns from save() while a thread of its own is still to write ``rank<r>-late.bin``, as a
    loop that writes its metadata in the background without telling the tool does. The next
    step waits for that thread, so the file is there when the group ends, in every run."""

    writer: threading.Thread | None = None

    def save(self, checkpoint_dir: str) -> None:
        super().save(checkpoint_dir)
        late = os.path.join(checkpoint_dir, f"rank{self.rank}-{LATE}")
        self.writer = threading.Thread(target=_write_later, args=(late,), daemon=True)
        self.writer.start()

    def step(self) -> float:
        if self.writer is not None:
            self.writer.join()
            self.writer = None
        loss: float = super().step()
        return loss


def _write_later(path: str) -> None:
    time.sleep(LATE_DELAY_SECONDS)
    with open(path, "wb") as f:
        f.write(b"written after save() returned")


def saves_a_fifo(rank: int, world_size: int) -> Any:
    return SavesAFifo(rank, world_size)


def saves_a_socket(rank: int, world_size: int) -> Any:
    return SavesASocket(rank, world_size)


def saves_a_device(rank: int, world_size: int) -> Any:
    return SavesADevice(rank, world_size)


def saves_a_sparse_file(rank: int, world_size: int) -> Any:
    return SavesASparseFile(rank, world_size)


def writes_after_save(rank: int, world_size: int) -> Any:
    return WritesAfterSave(rank, world_size)
