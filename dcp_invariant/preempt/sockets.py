"""The tool's Unix sockets: where its end lives (AF_UNIX paths stop at 108 bytes, 104 on macOS,
so a long TMPDIR cannot hold one, and the socket gets a short directory of its own), and the
variables that tell the interposer (interposer.c) which socket to report to and about which
directory."""

from __future__ import annotations

import os
import tempfile

SOCKET_ENV = "DCP_INVARIANT_PREEMPT_SOCKET"
ROOT_ENV = "DCP_INVARIANT_PREEMPT_ROOT"
# Room left under the directory for the socket's own name and mkdtemp's.
_LONGEST_PARENT = 80


def socket_directory(parent: str) -> str:
    """A new directory for sockets: under ``parent``, or under /tmp where ``parent`` is too
    long a path. The caller removes it."""
    short = len(parent) <= _LONGEST_PARENT or not os.path.isdir("/tmp")
    return tempfile.mkdtemp(prefix="dcpi-", dir=parent if short else "/tmp")
