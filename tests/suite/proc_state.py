"""Processes as Linux's /proc shows them, for the tests that watch processes end: a process
killed outside this one's children is reaped by init, so a PID alone says nothing; and the
processes a run started, found by the private TMPDIR in their environment."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path


def stat(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat``'s fields after the command name (state, ppid, pgrp, session...);
    None once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: neither gone nor a zombie."""
    fields = stat(pid)
    return fields is not None and fields[:1] not in ([], [b"Z"], [b"X"])


def wait_until(condition: Callable[..., object], seconds: float = 5.0) -> bool:
    """Poll ``condition`` until it holds (True) or ``seconds`` pass (False).

    ``...``: a caller in a loop binds the loop variable as a default, ``lambda r=run: ...``.
    """
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def processes_with(marker: str) -> list[int]:
    """PIDs whose environment mentions ``marker`` (this test's private TMPDIR)."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if needle in (entry / "environ").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def describe(pids: list[int]) -> list[str]:
    """Each process's PID, parent, state and command line, for a failure message."""
    out = []
    for pid in pids:
        try:
            status = dict(
                line.split(":\t", 1)
                for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if ":\t" in line
            )
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:160]
        except OSError:
            continue
        out.append(f"{pid} ppid={status.get('PPid')} {status.get('State')} {command.decode()}")
    return out


def torchrun_ranks_with(marker: str) -> list[int]:
    """Of :func:`processes_with`, the torchrun job's ranks."""
    found = []
    for pid in processes_with(marker):
        try:
            if b"elastic_rank" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
        except OSError:
            continue
    return found
