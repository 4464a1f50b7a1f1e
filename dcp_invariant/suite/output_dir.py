"""Where a run's artifact goes: reserved before the suite starts, filled at once after it.

Everything that could make the run fail at its very end is checked first (a missing or
unwritable parent, a name too long for the staging directory, a full disk, a second run into
the same directory), so minutes of scenarios are never thrown away over it. The artifact is
written into a staging directory beside the target and renamed into place: a reader sees no
artifact or a whole one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import IO

from dcp_invariant.errors import BadInput
from dcp_invariant.evidence import schema
from dcp_invariant.suite.workspace import (
    EnvironmentProblem,
    check_free,
    environment_problem,
    lock_exclusive,
)

# The staging directory is ".<name>." plus 8 random characters; the lock ".<name>.lock".
STAGING_EXTRA = 10
NAME_MAX = 255
MIN_FREE_BYTES = 16 << 20
# The fix for a parent that cannot take the artifact: the parent is the user's choice, not the
# temp directory's.
OTHER_DIR = "choose another --output-dir"


class OutputDirError(BadInput):
    """The output directory cannot take an artifact; the message says what to change."""


class Reservation:
    """A locked staging directory beside ``target``; :meth:`fill` renames it into place."""

    def __init__(self, target: Path) -> None:
        self.target = target
        parent = target.parent
        check_target(target)
        try:
            check_free(parent, "the output directory's parent", MIN_FREE_BYTES, fix=OTHER_DIR)
        except EnvironmentProblem as exc:
            raise OutputDirError(str(exc)) from exc
        self._lock_path = parent / f".{target.name}.lock"
        try:
            self._lock: IO[bytes] | None = open(self._lock_path, "ab")  # noqa: SIM115
            lock_exclusive(self._lock)
        except BlockingIOError as exc:
            raise OutputDirError(
                f"another dcp-invariant run is writing {target}: wait for it or choose another "
                "--output-dir"
            ) from exc
        except OSError as exc:
            raise OutputDirError(str(environment_problem(exc, f"{parent}", OTHER_DIR))) from exc
        try:
            self.stage: Path | None = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=parent))
        except OSError as exc:
            self.release()
            raise OutputDirError(str(environment_problem(exc, f"{parent}", OTHER_DIR))) from exc

    def fill(self, files: dict[str, bytes]) -> None:
        """Write ``files`` into the stage and rename it to the target, which must still be free."""
        assert self.stage is not None, "a reservation is filled once"
        for sub in schema.ARTIFACT_DIRS:
            (self.stage / sub).mkdir()
        for rel, data in sorted(files.items()):
            # Binary mode: LF line endings on every platform.
            (self.stage / rel).write_bytes(data)
        target = self.target
        if target.is_dir() and not target.is_symlink() and not any(target.iterdir()):
            target.rmdir()  # an empty directory the caller made (``mktemp -d``) is taken
        if target.exists() or target.is_symlink():
            raise FileExistsError(f"{target} appeared while the suite ran; nothing was written")
        os.rename(self.stage, target)
        self.stage = None

    def release(self) -> None:
        """Remove the stage (unless filled) and the lock; safe to call more than once."""
        if getattr(self, "stage", None) is not None:
            assert self.stage is not None
            shutil.rmtree(self.stage, ignore_errors=True)
            self.stage = None
        if self._lock is not None:
            self._lock.close()
            self._lock = None
            with contextlib.suppress(OSError):
                self._lock_path.unlink()


def check_target(target: Path) -> None:
    """Whether `target` can take an artifact: read-only, so every rank of a job may ask at once."""
    parent = target.parent
    # Its own name first: one too long for a file name would fail every stat below.
    size = len(os.fsencode(target.name))
    limit = _name_max(parent) - STAGING_EXTRA
    if size > limit:
        raise OutputDirError(
            f"the output directory's name is {size} bytes; at most {limit} leave room for its "
            "staging directory: choose a shorter --output-dir"
        )
    try:
        _check_target(target, parent)
    except OSError as exc:
        # What the checks could not even ask (a name on the way, or the whole path, longer than
        # the OS opens; a directory on the way that may not be searched): named, with the output
        # directory as the fix.
        raise OutputDirError(_unaskable(target, exc)) from exc


def _unaskable(target: Path, exc: OSError) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        for part in target.parent.parts:
            size = len(os.fsencode(part))
            if size > NAME_MAX:
                return (
                    f"the output directory's path holds a name of {size} bytes "
                    f"({part[:40]!r}...), longer than a file name can be ({NAME_MAX}): choose "
                    "another --output-dir"
                )
        return (
            f"the output directory's path is {len(os.fsencode(str(target)))} bytes, longer than "
            "the OS opens: choose a shorter --output-dir"
        )
    return f"cannot check {target}: {exc.strerror or exc}: choose another --output-dir"


def _check_target(target: Path, parent: Path) -> None:
    if target.is_symlink() or (
        target.exists() and not (target.is_dir() and not any(target.iterdir()))
    ):
        raise OutputDirError(
            f"{target} already exists and is not an empty directory: choose a new --output-dir "
            "(nothing is overwritten)"
        )
    if parent.exists() and not parent.is_dir():
        raise OutputDirError(f"{parent} is not a directory: choose another --output-dir")
    if not parent.is_dir():
        raise OutputDirError(f"{parent} does not exist: create it or choose another --output-dir")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputDirError(f"{parent} is not writable: choose another --output-dir")


def _name_max(directory: Path) -> int:
    if sys.platform == "win32":
        return NAME_MAX
    try:
        return int(os.pathconf(directory, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return NAME_MAX
