"""The reaper finds a run's processes by the marks they were started with, whatever session they
moved to, and kills them; its guardian does so, and removes what the run told it of, once the
runner is gone, even after a SIGKILL."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from proc_state import alive, stat, wait_until

from dcp_invariant.suite import reaper
from dcp_invariant.suite.reaper import Guardian, Straggler

linux_only = pytest.mark.skipif(not reaper.supported(), reason="reads /proc (Linux only)")

TIMEOUT = 60
SLEEP = ["sleep", "60"]
# How multiprocessing starts its resource tracker (multiprocessing/resource_tracker.py,
# ensure_running): a command line that names the module, as the reaper looks for.
TRACKER = [sys.executable, "-c", "from multiprocessing.resource_tracker import main; "
           "import time; time.sleep(60)"]  # fmt: skip
MARK = "DCP_INVARIANT_TEST_MARK"

if sys.platform == "win32":
    KILLED = 1  # what Popen.kill (TerminateProcess) leaves; no test that reads it runs there
else:
    KILLED = -signal.SIGKILL  # a Popen's return code once SIGKILL ended it

Start = Callable[..., "subprocess.Popen[bytes]"]


@pytest.fixture
def start() -> Iterator[Start]:
    """Start a process; every one is killed (if still running) and reaped when the test ends."""
    procs: list[subprocess.Popen[bytes]] = []

    def started(
        argv: list[str], env: dict[str, str] | None = None, new_session: bool = False
    ) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(
            argv,
            env=None if env is None else {**os.environ, **env},
            start_new_session=new_session,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
        return proc

    yield started
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=TIMEOUT)


def end_orphans(*pids: int) -> None:
    """Kill what a test left running outside this process's children (init reaps it, or this
    process if it is a subreaper, PR_SET_CHILD_SUBREAPER)."""
    if sys.platform == "win32":  # every caller is skipped there (/proc): this is for mypy
        raise AssertionError("the reaper's finders are Linux only")
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def run_script(
    script: str, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=cwd,
        check=False,
    )


# --- where it works, and the marks -------------------------------------------------------------


def test_supported_only_where_proc_can_be_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert reaper.supported() == (sys.platform == "linux" and Path("/proc").is_dir())
    monkeypatch.setattr(reaper, "PROC", tmp_path / "absent")
    assert not reaper.supported()
    # Without /proc the finders find nothing, rather than fail the run.
    assert reaper.carrying(reaper.RUN_ENV, "x") == []
    assert reaper.of_group("mark", {os.getpid()}) == []


def test_a_runs_token_is_new_each_time_and_a_groups_mark_names_its_workspace_and_group() -> None:
    tokens = {reaper.new_token() for _ in range(3)}
    assert len(tokens) == 3
    assert all(len(t) == 32 and int(t, 16) >= 0 for t in tokens)
    assert reaper.group_mark("/tmp/ws/resume_1", "reference") == "/tmp/ws/resume_1::reference"
    assert reaper.group_mark("/w", "reference") != reaper.group_mark("/w", "repeat")


# --- finding and killing -----------------------------------------------------------------------


@linux_only
def test_a_process_is_found_by_the_exact_variable_and_value_it_was_started_with(
    start: Start,
) -> None:
    token = reaper.new_token()
    carrier = start(SLEEP, env={MARK: token})
    start(SLEEP, env={MARK: token + "0"})  # a longer value
    start(SLEEP, env={f"{MARK}_OTHER": token})  # the value under another name
    start(SLEEP)
    assert reaper.carrying(MARK, token) == [carrier.pid]


@linux_only
def test_a_groups_processes_are_found_by_its_mark_or_by_a_session_it_leads(start: Start) -> None:
    mark = reaper.group_mark("/w", "reference")
    marked = start(SLEEP, env={reaper.GROUP_ENV: mark})
    # A session the group's worker leads, holding a child that carries no mark.
    leader = start(["sh", "-c", "sleep 60 & wait"], new_session=True)
    start(SLEEP, env={reaper.GROUP_ENV: reaper.group_mark("/w", "repeat")})
    start(SLEEP)

    def found() -> list[int]:
        return sorted(reaper.of_group(mark, {leader.pid}))

    assert wait_until(lambda: len(found()) == 3), found()
    group = found()
    [child] = set(group) - {marked.pid, leader.pid}
    try:
        fields = stat(child)
        assert fields is not None and fields[3] == str(leader.pid).encode()  # in its session
        killed = reaper.kill_all(lambda: reaper.of_group(mark, {leader.pid}))
        assert sorted(s.pid for s in killed) == group
        assert sorted(s.name for s in killed) == ["sh", "sleep", "sleep"]
        assert marked.wait(timeout=TIMEOUT) == KILLED
        assert leader.wait(timeout=TIMEOUT) == KILLED
        assert wait_until(lambda: not alive(child))
    finally:
        end_orphans(child)


@linux_only
def test_kill_all_kills_what_it_finds_and_describes_each_before_the_kill(start: Start) -> None:
    sleeper, tracker, bystander = start(SLEEP), start(TRACKER), start(SLEEP)
    assert reaper.kill_all(list) == []  # nothing found: nothing done

    killed = reaper.kill_all(lambda: [sleeper.pid, tracker.pid])
    assert sorted(killed, key=lambda s: s.pid) == sorted(
        [
            Straggler(sleeper.pid, "sleep", helper=False),
            Straggler(tracker.pid, os.path.basename(sys.executable), helper=True),
        ],
        key=lambda s: s.pid,
    )
    assert sleeper.wait(timeout=TIMEOUT) == KILLED
    assert tracker.wait(timeout=TIMEOUT) == KILLED
    assert bystander.poll() is None
    # Gone (and reaped): nothing left to describe.
    assert reaper.describe(sleeper.pid) is None


# A process that starts children, then has reap_children end all but one; what it saw, as JSON.
REAP = """
import json, os, subprocess, sys
from dcp_invariant.suite import reaper

quiet = dict.fromkeys(("stdin", "stdout", "stderr"), subprocess.DEVNULL)
kept = subprocess.Popen(["sleep", "60"], **quiet)
ended = [subprocess.Popen(argv, **quiet) for argv in json.loads(sys.argv[1])]
names = reaper.reap_children({kept.pid})
reaped = []
for proc in ended:
    try:
        os.waitpid(proc.pid, os.WNOHANG)
        reaped.append(False)
    except ChildProcessError:
        reaped.append(True)
kept_running = kept.poll() is None
kept.kill()
kept.wait()
print(json.dumps({"names": names, "reaped": reaped, "kept_running": kept_running}))
"""


@linux_only
def test_reap_children_ends_all_but_the_excluded_and_names_them_sorted_but_the_tracker() -> None:
    # Started in this order (so found in it, by PID): the names come back sorted instead.
    done = run_script(REAP, json.dumps([["tail", "-f", "/dev/null"], TRACKER, SLEEP]))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "names": ["sleep", "tail"],
        "reaped": [True, True, True],
        "kept_running": True,
    }


# A process that becomes a subreaper and has a shell start a daemon and exit; the daemon's PID,
# its parent's and this process's.
ADOPT = """
import os, signal, subprocess
from pathlib import Path
from dcp_invariant.suite import reaper

reaper.become_subreaper()
shell = subprocess.run(
    ["sh", "-c", "sleep 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, timeout=30
)
daemon = int(shell.stdout)
parent = int(Path(f"/proc/{daemon}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
os.kill(daemon, signal.SIGKILL)
print(daemon, parent, os.getpid(), flush=True)
os.waitpid(daemon, 0)
"""


@linux_only
def test_a_subreaper_adopts_what_its_children_abandon() -> None:
    done = run_script(ADOPT)
    assert len(done.stdout.split()) == 3, done.stderr
    daemon, parent, me = (int(n) for n in done.stdout.split())
    try:
        assert parent == me, "the daemon went to another process, not the subreaper"
        assert done.returncode == 0, done.stderr
    finally:
        end_orphans(daemon)


# --- the guardian --------------------------------------------------------------------------------


def test_a_guardian_sets_the_runs_token_for_its_block_and_restores_what_was_there(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(reaper.RUN_ENV, raising=False)
    with Guardian() as guardian:
        assert os.environ[reaper.RUN_ENV] == guardian.token
    assert reaper.RUN_ENV not in os.environ
    monkeypatch.setenv(reaper.RUN_ENV, "an outer run's")
    with Guardian() as inner:
        assert os.environ[reaper.RUN_ENV] == inner.token != guardian.token
    assert os.environ[reaper.RUN_ENV] == "an outer run's"


def test_without_proc_a_guardian_starts_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reaper, "PROC", tmp_path / "absent")
    (tmp_path / "work").mkdir()
    with Guardian() as guardian:
        assert guardian.pid is None
        assert os.environ[reaper.RUN_ENV] == guardian.token
        guardian.remove_if_killed(tmp_path / "work")  # nobody to tell: nothing happens
        assert guardian.sweep() == []
    assert (tmp_path / "work").is_dir()


@linux_only
def test_the_guardian_leads_its_own_session_carries_no_token_and_ends_with_the_block() -> None:
    with Guardian() as guardian:
        pid = guardian.pid
        assert pid is not None
        fields = stat(pid)
        assert fields is not None and fields[3] == str(pid).encode()  # leads its session
        # It does not carry what it kills: a sweep must not end it.
        assert pid not in reaper.carrying(reaper.RUN_ENV, guardian.token)
    assert stat(pid) is None  # ended, and reaped by the block


@linux_only
def test_a_sweep_kills_what_was_started_inside_the_block_and_nothing_else(start: Start) -> None:
    before = start(SLEEP)
    with Guardian() as guardian:
        inside = start(SLEEP)
        moved = start(SLEEP, new_session=True)  # another session: the token still marks it
        killed = guardian.sweep()
        assert sorted(killed, key=lambda s: s.pid) == [
            Straggler(inside.pid, "sleep", helper=False),
            Straggler(moved.pid, "sleep", helper=False),
        ]
    assert inside.wait(timeout=TIMEOUT) == KILLED
    assert moved.wait(timeout=TIMEOUT) == KILLED
    assert before.poll() is None


@linux_only
def test_leaving_the_block_has_the_guardian_kill_what_still_carries_the_token(
    start: Start, tmp_path: Path
) -> None:
    (tmp_path / "work").mkdir()
    with Guardian() as guardian:
        left = start(SLEEP, new_session=True)
        guardian.remove_if_killed(tmp_path / "work")
    # Killed by the guardian, in its own process, before the block's end returned.
    assert left.poll() == KILLED
    # The runner ended its block: what it told of was its own to remove, and stays.
    assert (tmp_path / "work").is_dir()


# A runner that starts a guardian, moves to argv[1], tells it of the relative "work" and of
# argv[2], starts a process in a session of its own, prints the guardian's PID and that
# process's, and dies by SIGKILL.
KILLED_RUNNER = """
import os, signal, subprocess, sys
from pathlib import Path
from dcp_invariant.suite.reaper import Guardian

guardian = Guardian().__enter__()
os.chdir(sys.argv[1])
guardian.remove_if_killed(Path("work"))
guardian.remove_if_killed(Path(sys.argv[2]))
child = subprocess.Popen(
    ["sleep", "60"],
    start_new_session=True,
    stdin=subprocess.DEVNULL,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,  # else the test's wait for the runner's output would wait for it
)
print(guardian.pid, child.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@linux_only
def test_after_a_sigkill_the_guardian_kills_the_runs_processes_and_removes_what_it_was_told(
    tmp_path: Path,
) -> None:
    run, started_in = tmp_path / "run", tmp_path / "started-in"
    for directory in (run / "work" / "sub", run / "kept", started_in / "work"):
        directory.mkdir(parents=True)
        (directory / "f").write_bytes(b"x")
    newline = tmp_path / "a\nname"  # a path may hold a newline: messages end with a NUL
    newline.mkdir()

    done = run_script(KILLED_RUNNER, str(run), str(newline), cwd=started_in)
    assert done.returncode == KILLED, done.stderr
    assert len(done.stdout.split()) == 2, done.stdout
    guardian, child = (int(n) for n in done.stdout.split())
    try:
        assert wait_until(lambda: not alive(child)), "the run's process outlived the runner"
        assert wait_until(lambda: not (run / "work").exists() and not newline.exists())
        assert wait_until(lambda: not alive(guardian))
        # "work" was told after the runner moved: the guardian removed that one, not the one
        # where both started; what it was not told of stays.
        assert (started_in / "work" / "f").read_bytes() == b"x"
        assert (run / "kept" / "f").read_bytes() == b"x"
    finally:
        end_orphans(guardian, child)
