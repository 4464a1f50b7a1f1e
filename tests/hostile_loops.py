"""Loops that do what a user's code may do behind the tool's back: leave processes or threads
running, change the working directory. Each is the example's correct loop otherwise, so any
failure is the tool's."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from mlp_fixture import App

# Far longer than any test waits: a run that waited for these would time the test out.
SLEEP = "600"
# What LeavesThreads starts, and the event its threads wait for, which is never set.
THREADS = 50
NEVER = threading.Event()


class LeavesADaemon(App):
    """Starts a detached process in a session of its own at step ``$HOSTILE_DAEMON_STEP`` (the
    second by default), and forgets it."""

    def step(self) -> float:
        loss: float = super().step()
        if self.cursor == int(os.environ.get("HOSTILE_DAEMON_STEP", "2")):
            subprocess.Popen(
                ["sleep", SLEEP],
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        return loss


class DoubleForks(App):
    """Daemonizes a forked copy of itself the classic way: fork, setsid, fork, parent exits."""

    def step(self) -> float:
        loss: float = super().step()
        if sys.platform != "win32" and self.cursor == 2 and os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execvp("sleep", ["sleep", SLEEP])
            os._exit(0)
        return loss


class LeavesThreads(App):
    """Starts ``THREADS`` threads that are not daemons and never end, in its first step, and
    returns at once: the step is done, but the worker cannot exit."""

    def step(self) -> float:
        loss: float = super().step()
        if self.cursor == 1:
            for i in range(THREADS):
                threading.Thread(target=NEVER.wait, name=f"never-ending-{i}").start()
        return loss


class ChangesDirectory(App):
    """Moves into ``$HOSTILE_CHDIR`` in its constructor and at every step."""

    def __init__(self, rank: int, world_size: int) -> None:
        os.chdir(os.environ["HOSTILE_CHDIR"])
        super().__init__(rank, world_size)

    def step(self) -> float:
        os.chdir(os.environ["HOSTILE_CHDIR"])
        loss: float = super().step()
        return loss

    def state_dict(self) -> Any:
        os.chdir(os.environ["HOSTILE_CHDIR"])
        return super().state_dict()


def leaves_a_daemon(rank: int, world_size: int) -> App:
    return LeavesADaemon(rank, world_size)


def double_forks(rank: int, world_size: int) -> App:
    return DoubleForks(rank, world_size)


def leaves_threads(rank: int, world_size: int) -> App:
    return LeavesThreads(rank, world_size)


def changes_directory(rank: int, world_size: int) -> App:
    return ChangesDirectory(rank, world_size)
