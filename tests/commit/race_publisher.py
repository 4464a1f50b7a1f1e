"""One of two publishers promoting into the same store at once; ``test_race.py`` runs two of them.

Both seal on the same pointer. The order is fixed by files in a sync directory: the ``first``
publisher, holding the store's lock with its generation checked and verified, waits until the
``second`` has been refused the lock, and only then writes the pointer. Prints one JSON report.

Usage: python race_publisher.py ROOT LABEL first|second SYNC_DIR SECONDS
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from dcp_invariant.commit import CheckpointStore, StaleParent, lock, pointer


def wait_for(path: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def publish(root: str, label: str, role: str, sync: Path, seconds: float) -> dict[str, Any]:
    store = CheckpointStore(root, lock_timeout=seconds)
    other = "second" if role == "first" else "first"
    report: dict[str, Any] = {"label": label, "role": role}
    store.seal(label)
    (sync / f"sealed-{role}").touch()
    if not wait_for(sync / f"sealed-{other}", seconds):
        return {**report, "outcome": "the other publisher never sealed"}
    if role == "first":
        real_write = pointer.write

        def write(path: Path, record: pointer.Pointer) -> None:
            (sync / "first-is-publishing").touch()
            report["second_was_blocked"] = wait_for(sync / "second-blocked", seconds)
            real_write(path, record)

        pointer.write = write  # type: ignore[assignment]
    else:
        if not wait_for(sync / "first-is-publishing", seconds):
            return {**report, "outcome": "the first publisher never got to its pointer write"}
        real_try = lock.try_lock

        def try_lock(fd: int) -> bool:
            taken = real_try(fd)
            if not taken:
                (sync / "second-blocked").touch()
            return taken

        lock.try_lock = try_lock
    try:
        generation = store.promote(label)
    except StaleParent as exc:
        return {
            **report,
            "outcome": "StaleParent",
            "expected": exc.expected,
            "actual": exc.actual,
            "generation": exc.generation,
            "message": str(exc),
        }
    return {**report, "outcome": "promoted", "generation": generation.digest}


if __name__ == "__main__":
    root, label, role, sync, seconds = sys.argv[1:]
    print(json.dumps(publish(root, label, role, Path(sync), float(seconds))))
