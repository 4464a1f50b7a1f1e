"""Where a run's artifact goes: reserved before the suite starts, filled at once after it.

Everything that could make the run fail at its very end is checked first (a missing or
unwritable parent, a name too long for the staging directory, a full disk, a second run into
the same directory), so minutes of scenarios are never thrown away over it. The artifact is
written into a staging directory beside the target and renamed into place: a reader sees no
artifact or a whole one.

A run killed with SIGKILL cannot remove its lock and staging directory; the lock records the
staging directory's name, so whoever next finds the lock free removes both: the run's guardian
(dcp_invariant/suite/reaper.py), or the next run whose output directory has the same parent.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import IO

from dcp_invariant.errors import EnvironmentProblem, OutputDirError
from dcp_invariant.evidence import schema
from dcp_invariant.suite.workspace import check_free, environment_problem, lock_exclusive, remove

# The staging directory is ".<name>." plus 8 random characters; the lock ".<name>.lock".
STAGING_EXTRA = 10
NAME_MAX = 255
MIN_FREE_BYTES = 16 << 20
# The fix for a parent that cannot take the artifact: the parent is the user's choice, not the
# temp directory's.
OTHER_DIR = "choose another --output-dir"
# The lock file's first line: the record a run keeps in it (its PID, for a reader, and its
# staging directory). A ".<name>.lock" without it may be another tool's, and is left alone.
RECORD_HEADER = b"dcp-invariant output-dir lock 1\n"
RECORD_MAX = 4096
LOCK_NAME = re.compile(r"\.(.+)\.lock", re.DOTALL)  # a directory's name may hold a newline
# tempfile.mkdtemp's 8 random characters (``_RandomNameSequence`` in CPython's Lib/tempfile.py):
# a staging directory is removed only under exactly ".<name>." and 8 of these.
STAGE_SUFFIX = re.compile(r"[a-z0-9_]{8}")
# How long a run waits for a lock that is held: another run or a guardian clearing a dead run's
# lock holds it while it removes the staging directory, a few milliseconds; a live run, minutes.
LOCK_WAIT = 1.0
# open(2)'s flags where the OS has them; Windows has neither, and wants O_BINARY instead.
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_BINARY = getattr(os, "O_BINARY", 0)


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
        self.lock_path = parent / f".{target.name}.lock"
        self._lock: IO[bytes] | None = None
        self.stage: Path | None = None
        try:
            self._lock = _take_lock(self.lock_path)
        except BlockingIOError as exc:
            raise OutputDirError(
                f"another dcp-invariant run is writing {target}: wait for it or choose another "
                "--output-dir"
            ) from exc
        except OSError as exc:
            raise OutputDirError(str(environment_problem(exc, f"{parent}", OTHER_DIR))) from exc
        try:
            # Held by us, the lock's record is a dead run's: its staging directory goes first.
            _remove_dead_stages(parent, target.name, _read_record(self._lock) or [])
            self.stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=parent))
            _write_record(self._lock, self.stage.name[len(target.name) + 2 :])
        except OSError as exc:
            self.release()
            raise OutputDirError(str(environment_problem(exc, f"{parent}", OTHER_DIR))) from exc
        except BaseException:
            self.release()  # an interrupt: nothing of this run is left beside the target
            raise
        try:
            sweep_dead(parent, self.lock_path)
        except BaseException:
            self.release()
            raise

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
        kept = False
        if self.stage is not None:
            shutil.rmtree(self.stage, ignore_errors=True)
            # A stage that could not be removed keeps its lock and record: the next run retries.
            kept = os.path.lexists(self.stage)
            self.stage = None
        if self._lock is not None:
            handle, self._lock = self._lock, None
            if kept:
                handle.close()
                return
            try:
                _unlink_held(handle, self.lock_path)
            except OSError as exc:
                # The parent turned read-only meanwhile: the lock is free now, and the next run
                # whose output directory is beside it removes it.
                print(
                    f"dcp-invariant: warning: could not remove {self.lock_path} "
                    f"({exc.strerror or exc}); the next run removes it",
                    file=sys.stderr,
                )


def clear_if_dead(lock: Path) -> bool:
    """Remove ``lock`` and the staging directory its record names if it is a dcp-invariant
    output directory's lock that no process holds; True if it was removed.

    The guardian calls it after the runner died, and each run calls it on the dead locks beside
    its output directory (:func:`sweep_dead`). Liveness is the lock itself, not the PID it
    records (a PID is reused): the kernel drops a flock(2) lock when the last descriptor of
    its open file is closed, which a process's death does, however it dies.
    """
    match = LOCK_NAME.fullmatch(lock.name)
    if match is None:
        return False
    try:
        if not stat.S_ISREG(os.lstat(lock).st_mode):
            return False
        # Neither created nor followed, nor waited on. Read-write: on NFS flock(2) is emulated
        # by fcntl(2) byte-range locks, and an exclusive one needs a file open for writing.
        fd = os.open(lock, os.O_RDWR | _NOFOLLOW | _NONBLOCK | _BINARY)
    except OSError:
        return False  # removed meanwhile, or not ours to open
    with os.fdopen(fd, "r+b") as handle:
        try:
            if not _clear_held(handle, lock, match[1]):
                return False
            _unlink_held(handle, lock)
        except OSError:
            return False  # a read or a removal failed: the lock stays for the next run to clear
    return True


def _clear_held(handle: IO[bytes], lock: Path, name: str) -> bool:
    """Lock ``handle`` (the lock file ``lock`` of output directory ``name``) if it holds a
    record and no one holds it, and remove the staging directories it records."""
    # Read before locking: another tool's lock file must not be locked, even for a moment, by
    # a stranger.
    if _read_record(handle) is None:
        return False
    handle.seek(0)  # msvcrt.locking locks from the file's position: the byte its holder locked
    try:
        lock_exclusive(handle)
    except OSError:
        return False  # held: its run is alive
    # Read again under the lock: the file may have changed hands before it was taken.
    stages = _read_record(handle) if _at(handle, lock) else None
    return stages is not None and _remove_stages(lock.parent, name, stages)


def sweep_dead(parent: Path, own: Path | None = None) -> list[Path]:
    """Clear the dead runs' locks (and their staging directories) in ``parent`` but ``own``;
    return the locks removed."""
    try:
        entries = sorted(parent.iterdir())
    except OSError:
        return []  # a parent that may be written but not listed (mode -wx): nothing to find
    return [e for e in entries if e != own and LOCK_NAME.fullmatch(e.name) and clear_if_dead(e)]


def _take_lock(path: Path) -> IO[bytes]:
    """Open and lock ``path``, creating it; BlockingIOError if it stays held ``LOCK_WAIT``.

    Whoever clears a dead lock removes its file while holding it; a run that opened the file
    just before would then lock a file no longer at ``path``, while another run locks a new one
    there. So the lock taken must still be the file at ``path``, or it is taken again.
    """
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        # Not truncated on opening: a live holder's record must survive a refused run.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _BINARY, 0o666)
        handle = os.fdopen(fd, "r+b")
        try:
            lock_exclusive(handle)
        except BlockingIOError:
            handle.close()
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)
            continue
        except BaseException:
            handle.close()
            raise
        if _at(handle, path):
            return handle
        handle.close()  # removed by whoever cleared it, after we opened it
        if time.monotonic() >= deadline:
            raise BlockingIOError(errno.EAGAIN, "the lock file kept being replaced", str(path))


def _at(handle: IO[bytes], path: Path) -> bool:
    """Whether ``handle``'s file is still the one at ``path``."""
    if sys.platform == "win32":
        # CPython opens files without FILE_SHARE_DELETE: one held open cannot be removed.
        return True
    try:
        there = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(handle.fileno())
    return (there.st_dev, there.st_ino) == (held.st_dev, held.st_ino)


def _unlink_held(handle: IO[bytes], path: Path) -> None:
    """Remove the lock file ``path``, then drop (close) its lock ``handle``: no one can take a
    lock on a file about to go. Windows cannot remove a file held open: there, closed first."""
    try:
        if sys.platform == "win32":
            handle.close()
        path.unlink(missing_ok=True)
    finally:
        handle.close()


def _read_record(handle: IO[bytes]) -> list[str] | None:
    """The staging directories a lock's record names; None if the file holds no record."""
    handle.seek(0)
    data = handle.read(RECORD_MAX)
    if not data.startswith(RECORD_HEADER):
        return None
    stages = []
    for line in data[len(RECORD_HEADER) :].split(b"\n"):
        key, _, value = line.partition(b" ")
        suffix = value.decode("ascii", "replace")
        if key == b"stage" and STAGE_SUFFIX.fullmatch(suffix):
            stages.append(suffix)
    return stages


def _write_record(handle: IO[bytes], stage_suffix: str) -> None:
    handle.seek(0)
    handle.truncate()
    handle.write(RECORD_HEADER + f"pid {os.getpid()}\nstage {stage_suffix}\n".encode())
    handle.flush()


def _remove_stages(parent: Path, name: str, suffixes: list[str]) -> bool:
    """Remove the staging directories ``.<name>.<suffix>``; False if one could not be."""
    for suffix in suffixes:
        stage = parent / f".{name}.{suffix}"
        try:
            if stat.S_ISDIR(os.lstat(stage).st_mode):  # a symlink put in its place is not ours
                remove(stage)
        except FileNotFoundError:
            continue  # renamed into place (the run completed) or removed already
        except OSError:
            return False
    return True


def _remove_dead_stages(parent: Path, name: str, recorded: list[str]) -> None:
    """With ``name``'s lock held: remove the staging directories a dead run left, those its
    record names and, of those it does not (a run of an older version, or one killed between
    making its stage and recording it), the empty ones."""
    if not _remove_stages(parent, name, recorded):
        stages = ", ".join(f".{name}.{s}" for s in recorded)
        print(
            f"dcp-invariant: warning: could not remove a dead run's staging directory in "
            f"{parent} ({stages}); remove it by hand",
            file=sys.stderr,
        )
    prefix = f".{name}."
    with contextlib.suppress(OSError):  # a parent that may not be listed: nothing to find
        for entry in parent.iterdir():
            suffix = entry.name[len(prefix) :]
            if (
                entry.name.startswith(prefix)
                and STAGE_SUFFIX.fullmatch(suffix)
                and suffix not in recorded
            ):
                # rmdir(2) removes only an empty directory, never a file nor a symlink.
                with contextlib.suppress(OSError):
                    entry.rmdir()


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
