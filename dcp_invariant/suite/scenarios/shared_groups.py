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

import threading
from concurrent.futures import Future
from pathlib import Path

from dcp_invariant import canonical
from dcp_invariant.suite.pool import GroupOutcome, WorkerPool
from dcp_invariant.suite.scenarios import save_copy
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
        # What each copy left out (a FIFO, a socket, a device), by the path it would have had.
        self._refused: dict[Path, str] = {}

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
                refused = _copy_tree(home / name, workdir / name)
                with self._lock:
                    self._refused.update((workdir / name / r.path, r.kind) for r in refused)
        return outcome

    def refused(self, directory: Path) -> tuple[str, str] | None:
        """The first entry under ``directory`` (a candidate) that a copy left out, as its path
        relative to ``directory`` and its kind; None if the copy left out nothing there."""
        with self._lock:
            found = sorted(
                (path.relative_to(directory).as_posix(), kind)
                for path, kind in self._refused.items()
                if path.is_relative_to(directory)
            )
        return found[0] if found else None


def _copy_tree(source: Path, target: Path) -> list[save_copy.Refused]:
    """:func:`.save_copy.copy_tree`: by kind, never reading a FIFO, socket or device, which it
    leaves out and returns; interruptible; holes kept; a failure keeps its errno (not
    ``shutil.copytree``, which gathers per-file errors into ``shutil.Error`` as text, so a full
    disk would read as a driver error and fail the scenario instead of stopping the run)."""
    return save_copy.copy_tree(source, target)
