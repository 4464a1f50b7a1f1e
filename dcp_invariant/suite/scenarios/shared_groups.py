"""Worker groups that several scenarios run identically run once; each scenario gets a copy.

In the registered suite, training_2_to_1, training_2_to_2 and elastic_restart_2_to_2 train
and save the same way, and so do the three damage scenarios. A group's outcome is a function
of its task, world size, name and payload (the suite's evidence is byte-identical from run to
run), so running it again buys nothing but fresh interpreters, which on the spawn path
(macOS, Windows) are most of the suite's time. Only groups a driver marks as shareable are
shared. A fixture's arms that run the same steps on purpose, to catch non-determinism, have
names of their own (``reference``, ``repeat``), so each runs; its ``repeat`` and ``never_saves``
arms are the same in every scenario at one world size, and are shared (:mod:`.resume`). Each
scenario then seals, damages, promotes and loads its own copy of the checkpoint store, in its
own workspace.
"""

from __future__ import annotations

import os
import shutil
import threading
from concurrent.futures import Future
from pathlib import Path

from dcp_invariant import canonical
from dcp_invariant.suite.pool import GroupOutcome, WorkerPool
from dcp_invariant.suite.scenarios.payloads import Call


class SharedGroups:
    """One run's shareable groups, each run in a directory of its own under ``root``."""

    def __init__(self, root: Path, copied: tuple[str, ...]) -> None:
        self._root = root
        # What a group leaves that a scenario acts on: the store, the snapshots a later group
        # compares with.
        self._copied = copied
        self._lock = threading.Lock()
        self._runs: dict[bytes, Future[tuple[Path, GroupOutcome]]] = {}

    def run(
        self, pool: WorkerPool, call: Call, world_size: int, workdir: Path, name: str
    ) -> GroupOutcome:
        """The group's outcome, running it only if no scenario has; what it left copied to
        ``workdir``.

        The first scenario to ask runs the group; the others wait for it. If it fails to run
        at all (an interrupt), every waiter gets the same exception.
        """
        key = canonical.dumps(
            {"name": name, "payload": call.payload, "task": call.task, "ws": world_size}
        )
        with self._lock:
            future = self._runs.get(key)
            owner = future is None
            if future is None:
                future = Future()
                self._runs[key] = future
                home = self._root / f"group-{len(self._runs)}"
        if owner:
            try:
                home.mkdir(parents=True)
                future.set_result((home, pool.run_group(call, world_size, home, name)))
            except BaseException as exc:
                future.set_exception(exc)
                raise
        home, outcome = future.result()
        for name in self._copied:
            if (home / name).is_dir():
                _copy_tree(home / name, workdir / name)
        return outcome


def _copy_tree(source: Path, target: Path) -> None:
    """``shutil.copytree``, except that a failure keeps its errno.

    copytree gathers per-file errors into ``shutil.Error`` as text, so a full disk would read
    as a driver error and fail the scenario instead of stopping the run (exit 2). Symlinks are
    copied as links: the store refuses them, and a copy must not hide one.
    """
    for directory, subdirectories, files in os.walk(source):
        relative = Path(directory).relative_to(source)
        (target / relative).mkdir(parents=True, exist_ok=True)
        links = [d for d in subdirectories if (Path(directory) / d).is_symlink()]
        for name in [*files, *links]:  # os.walk lists a link to a directory but does not enter it
            shutil.copy2(Path(directory) / name, target / relative / name, follow_symlinks=False)
