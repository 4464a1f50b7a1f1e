"""A process's state as Linux's /proc shows it, for the tests that watch processes end: a
process killed outside this one's children is reaped by init, so a PID alone says nothing."""

from __future__ import annotations

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


def wait_until(condition: Callable[[], bool], seconds: float = 5.0) -> bool:
    """Poll ``condition`` until it holds (True) or ``seconds`` pass (False)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
