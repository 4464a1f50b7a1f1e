"""The run's workspace: a locked temp directory, checked before use and removed after it.

Every scenario writes its checkpoints, logs and worker temp files here, never in the caller's
directories. A runner killed with SIGKILL cannot remove its workspace; its lock dies with it,
so the next run finds the workspace unlocked and removes it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
import tempfile
from pathlib import Path
from types import TracebackType
from typing import IO

from dcp_invariant.errors import EnvironmentProblem

PREFIX = "dcp-invariant-"
LOCK_FILE = ".lock"
# Checkpoints of the registered suite take a few MiB; a user's fixture may take more.
MIN_FREE_BYTES = 64 << 20
# AF_UNIX socket paths are limited to 108 bytes on Linux and 104 on macOS (sys/un.h); the fork
# server's socket lies two levels below the temp directory.
MAX_SOCKET_PARENT = 60
SOCKET_HOLDER_PREFIX = "dcpi-"
ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS})


# The way out of a problem with the temp directory; a directory the user named has its own.
TMPDIR_FIX = "point TMPDIR at another directory"


def environment_problem(exc: OSError, where: str, fix: str = TMPDIR_FIX) -> EnvironmentProblem:
    return EnvironmentProblem(
        f"{where}: {exc.strerror or exc} ({exc.filename or 'no file named'}): free space or fix "
        f"the permissions there, or {fix}"
    )


class Workspace:
    """``with Workspace() as path:`` a fresh, locked directory under the temp directory."""

    def __init__(self) -> None:
        self.path: Path | None = None
        self._lock: IO[bytes] | None = None
        # Where multiprocessing's socket directory went instead, if the temp path was too long.
        self.socket_holder: Path | None = None

    def __enter__(self) -> Path:
        parent = Path(tempfile.gettempdir())
        check_free(parent, "the temp directory")
        sweep_stale(parent)
        try:
            self.path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
            self._lock = _create_locked(self.path / LOCK_FILE)
        except OSError as exc:
            raise environment_problem(exc, f"the temp directory {parent}") from exc
        self.socket_holder = _short_socket_directory(parent)
        return self.path

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._lock is not None and sys.platform == "win32":
            self._lock.close()  # Windows deletes no open file; elsewhere the lock outlives removal
        try:
            self._remove()
        finally:
            if self._lock is not None:
                self._lock.close()

    def _remove(self) -> None:
        # Removed while still locked (POSIX), so that another run's sweep cannot take the
        # workspace for a dead one's and race this removal.
        if self.path is not None:
            try:
                remove(self.path)
            except OSError as error:
                # Windows refuses to delete what a straggling process still holds open. The
                # scenarios' evidence is already gathered and must not be lost over it; the
                # lock goes with this run, so the next run sweeps the workspace.
                print(
                    f"dcp-invariant: warning: could not remove the workspace {self.path} "
                    f"({error.strerror or error}); the next run removes it",
                    file=sys.stderr,
                )
            except BaseException:
                # A signal arrived mid-removal (the CLI's handler raises once, then ignores
                # further signals): finish the removal, then let the interrupt go on.
                with contextlib.suppress(OSError):
                    remove(self.path)
                raise


def check_free(
    directory: Path, what: str, needed: int = MIN_FREE_BYTES, fix: str = TMPDIR_FIX
) -> None:
    """Refuse ``directory`` (``what`` names it) with less than ``needed`` bytes free; ``fix``
    says how to choose another."""
    try:
        free = shutil.disk_usage(directory).free
    except OSError as exc:
        raise environment_problem(exc, what, fix) from exc
    if free < needed:
        raise EnvironmentProblem(
            f"{what} {directory} has {free >> 20} MiB free, the run needs {needed >> 20} MiB: "
            f"free space there or {fix}"
        )


def sweep_stale(parent: Path) -> list[Path]:
    """Remove workspaces whose runner died (their lock is free); return what was removed."""
    removed: list[Path] = []
    try:
        entries = sorted(parent.iterdir())
    except OSError:
        return removed  # an unreadable temp directory: mkdtemp there says why, next
    for entry in entries:
        if entry.name.startswith(PREFIX) and _unlocked(entry / LOCK_FILE):
            try:
                remove(entry)
            except OSError:
                # Another run's sweep removed it first, or it is still held (Windows) or not
                # ours to remove: the next sweep retries.
                continue
            removed.append(entry)
    return removed


def remove(path: Path) -> None:
    """Remove a workspace, read-only generations included."""

    def writable_then_retry(function: object, name: str, _: object) -> None:
        os.chmod(os.path.dirname(name), 0o700)
        with contextlib.suppress(FileNotFoundError):
            os.chmod(name, 0o700)
        if os.path.isdir(name) and not os.path.islink(name):
            shutil.rmtree(name, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)

    shutil.rmtree(path, onerror=writable_then_retry)


def lock_exclusive(handle: IO[bytes]) -> None:
    """Lock ``handle``'s file for this process's lifetime; BlockingIOError if someone holds it.

    The kernel drops the lock when the process dies, however it dies.
    """
    if sys.platform == "win32":
        import msvcrt

        try:
            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
        except OSError as exc:
            raise BlockingIOError(*exc.args) from exc
    else:
        import fcntl

        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)


def _create_locked(lock_path: Path) -> IO[bytes]:
    """Create a workspace's lock file, already locked, and return it open.

    Another run's sweep removes a workspace whose lock file it can lock. Were the file created
    and then locked, a sweep in between would remove a live workspace: two pytest-xdist workers
    calling check() in one temp directory did (the second run's mkdir failed with ENOENT). On
    POSIX the file is locked under another name, which no sweep opens, and renamed into place:
    rename(2) keeps the open file and its flock. On Windows an open file cannot be deleted
    (CPython opens files without FILE_SHARE_DELETE, Modules/_io/fileio.c), so a sweep in that
    window fails on the lock file and leaves the workspace; LK_LOCK waits out its brief lock.
    """
    if sys.platform == "win32":
        import msvcrt

        handle = open(lock_path, "wb")  # noqa: SIM115 (the workspace's lifetime: closed on exit)
        try:
            msvcrt.locking(handle.fileno(), msvcrt.LK_LOCK, 1)  # retries for up to 10 s
        except BaseException:
            handle.close()
            raise
        return handle
    pending = lock_path.with_name(f"{lock_path.name}.pending")
    handle = open(pending, "wb")  # noqa: SIM115 (the workspace's lifetime: closed on exit)
    try:
        lock_exclusive(handle)
        os.replace(pending, lock_path)
    except BaseException:
        handle.close()
        raise
    return handle


def _unlocked(lock_path: Path) -> bool:
    """True only when the lock file exists and nobody holds it."""
    try:
        handle = open(lock_path, "rb+")  # noqa: SIM115 (closed below)
    except OSError:
        return False  # no lock file yet: a workspace being created, or not ours
    try:
        lock_exclusive(handle)
    except OSError:
        return False
    finally:
        handle.close()
    return True


def socket_holder_owner(path: Path) -> int | None:
    """The PID of the process a socket holder (``dcpi-<pid>-...``) belongs to, or None."""
    if not path.name.startswith(SOCKET_HOLDER_PREFIX):
        return None
    owner = path.name.removeprefix(SOCKET_HOLDER_PREFIX).split("-", 1)[0]
    return int(owner) if owner.isdigit() else None


# This process's socket holder, once made (a forked child inherits its parent's: hence the PID).
_holder: tuple[int, Path] | None = None


def _short_socket_directory(parent: Path) -> Path | None:
    """Keep the fork server's socket path short when the temp directory's path is long.

    multiprocessing puts its socket in a ``pymp-*`` directory under the temp directory, and a
    long TMPDIR makes ``bind`` fail with "AF_UNIX path too long". Its directory is chosen once
    per process, on first use, so choosing it here under a short parent is enough. Returns the
    directory made for it (removed at exit; should the process be killed, the run's guardian
    removes it), or None.
    """
    if sys.platform == "win32" or len(str(parent)) <= MAX_SOCKET_PARENT:
        return None
    global _holder
    if _holder is not None and _holder[0] == os.getpid():
        # multiprocessing chose its directory once for this process: a second holder would
        # stay empty until exit, one per run of a long-lived caller (check() in a test session).
        return _holder[1]
    from multiprocessing import util

    short_parent = next(
        (d for d in ("/tmp", "/var/tmp") if os.path.isdir(d) and os.access(d, os.W_OK)), None
    )
    if short_parent is None:
        return None
    # Named for the process that owns it (it goes at that process's exit), so that a dead
    # process's leftover in a shared /tmp can be told from a live one's.
    holder = tempfile.mkdtemp(prefix=f"{SOCKET_HOLDER_PREFIX}{os.getpid()}-", dir=short_parent)
    saved, tempfile.tempdir = tempfile.tempdir, holder
    try:
        util.get_temp_dir()  # cached for this process from now on
    finally:
        tempfile.tempdir = saved
    # multiprocessing removes its pymp-* directory in an exit finalizer of priority -100; this
    # one, at -101, runs after it.
    util.Finalize(None, shutil.rmtree, args=(holder, True), exitpriority=-101)
    _holder = (os.getpid(), Path(holder))
    return _holder[1]
