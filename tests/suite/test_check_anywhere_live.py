"""dcp_invariant.check() wherever a user calls it: in two threads at once, in a child a spawn or
forkserver ProcessPoolExecutor started, beside a fork server of the caller's, and ten times in
a row in one process.

Each caller is a script of its own, run in a subprocess with a timeout and a private temporary
directory: what a run starts is process-wide (multiprocessing's one fork server and resource
tracker), so this process's are left alone, and what the calls leave behind is measured there.
The fixture is the fastest correct one: an app that saves itself, at world size 1, two
scenarios (resume_1, half_written_1).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import proc_state
import pytest
from cli_runs import REVISION

from dcp_invariant.evidence import diagnosis

pytestmark = [
    pytest.mark.live,
    pytest.mark.skipif(sys.platform != "linux", reason="the fork server and /proc are Linux's"),
]

TESTS = Path(__file__).resolve().parents[1]
# Ten runs of about 8 s each here; a slow CI machine takes several times that.
TIMEOUT = 900
FAST = "saving_loops:saves_itself"

_THREADS = """
import json, sys, threading
import dcp_invariant

FIXTURES = {"correct": "fixture_loops:correct", "buggy": "saving_loops:scheduler_not_restored"}
seen = {}

def call(name):
    try:
        report = dcp_invariant.check(FIXTURES[name], world_sizes=[1])
    except BaseException as exc:
        seen[name] = {"raised": f"{type(exc).__name__}: {exc}"}
        return
    seen[name] = {
        "passed": report.passed,
        "scenarios": list(report.results),
        "causes": [d.cause for d in report.diagnoses],
        "text": str(report),
    }

threads = [threading.Thread(target=call, args=(name,)) for name in FIXTURES]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps(seen))
"""

_IN_A_CHILD = f"""
import multiprocessing, sys
from concurrent.futures import ProcessPoolExecutor

def check_here():
    import dcp_invariant
    report = dcp_invariant.check({FAST!r}, world_sizes=[1])
    return report.passed, list(report.results), str(report.artifact)

if __name__ == "__main__":
    context = multiprocessing.get_context(sys.argv[1])
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        print(pool.submit(check_here).result())
"""

_BESIDE_ITS_SERVER = f"""
import multiprocessing, os
from multiprocessing import forkserver
import dcp_invariant

if __name__ == "__main__":
    context = multiprocessing.get_context("forkserver")
    with context.Pool(1) as pool:
        pool.apply(os.getpid)
    server = forkserver._forkserver._forkserver_pid
    report = dcp_invariant.check({FAST!r}, world_sizes=[1])
    alive = os.waitpid(server, os.WNOHANG) == (0, 0)
    with context.Pool(1) as pool:
        pool.apply(os.getpid)
    print((report.passed, alive, forkserver._forkserver._forkserver_pid == server))
"""

_IN_A_ROW = f"""
import json, os
from pathlib import Path
from multiprocessing import forkserver
import dcp_invariant

def size(top):
    return sum(p.stat().st_size for p in Path(top).rglob("*") if p.is_file())

def children():
    me = str(os.getpid())
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:
            found.append(stat.parent.name + " " + fields[0])
    return found

temp = os.environ["TMPDIR"]
before = size(temp)
calls = []
for _ in range(10):
    report = dcp_invariant.check({FAST!r}, world_sizes=[1])
    calls.append({{
        "passed": report.passed,
        "artifact": str(report.artifact),
        "summary": report.summary,
        "entries": sorted(e.name for e in Path(temp).iterdir() if not e.name.startswith("pymp-")),
        "bytes": size(temp),
        "server": forkserver._forkserver._forkserver_pid,
        "children": children(),
    }})
print(json.dumps({{"before": before, "calls": calls}}))
"""


_made: list[Path] = []


def request_cleanup(temp: Path) -> None:
    _made.append(temp)


@pytest.fixture(autouse=True)
def _remove_short_temps() -> Iterator[None]:
    yield
    while _made:
        shutil.rmtree(_made.pop(), ignore_errors=True)


def _run(tmp_path: Path, script: str, *args: str) -> tuple[Any, Path]:
    """Run ``script`` as a user's file with ``args``; its JSON or printed line, and its
    temporary directory. No process of its run may outlive it."""
    # Short: the caller's own fork server binds a socket under it (AF_UNIX paths stop at 108
    # bytes), and pytest's tmp_path (or a CI job's TMPDIR) may already be past 80.
    temp = Path(tempfile.mkdtemp(prefix="ca-", dir="/tmp" if os.path.isdir("/tmp") else None))
    request_cleanup(temp)
    path = tmp_path / "caller.py"
    path.write_text(script, encoding="utf-8")
    env = {
        **os.environ,
        **dict.fromkeys(("TMPDIR", "TMP", "TEMP"), str(temp)),
        "GITHUB_SHA": REVISION,
        # The caller's own path after the test loops': the package under test as it is found.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
    }
    env.pop("DCP_INVARIANT_START_METHOD", None)
    try:
        done = subprocess.run(
            [sys.executable, str(path), *args], capture_output=True, text=True,
            timeout=TIMEOUT, cwd=tmp_path, env=env, check=False,
        )  # fmt: skip
    finally:
        left = proc_state.processes_with(str(temp))
        assert proc_state.wait_until(lambda: not proc_state.processes_with(str(temp))), (
            proc_state.describe(left)
        )
    assert done.returncode == 0, done.stdout + done.stderr
    last = done.stdout.strip().splitlines()[-1]
    return (json.loads(last) if last[:1] in "[{" else {"line": last}), temp


def test_two_threads_at_once_each_get_their_own_verdict(tmp_path: Path) -> None:
    """Two runs shared the process's one fork server, and the first to end stopped it under
    the other: a correct loop failed ('exited with code 255') or raised EOFError. Now a run
    waits for the other one's end, and each verdict is its own loop's."""
    seen, _ = _run(tmp_path, _THREADS)
    correct, buggy = seen["correct"], seen["buggy"]
    assert correct.get("passed") is True, correct
    assert buggy.get("passed") is False, buggy
    assert buggy["causes"] == [diagnosis.APP_ROUND_TRIP], buggy
    assert buggy["scenarios"] == ["resume_1", "half_written_1"], buggy


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_check_in_a_child_of_a_process_pool(tmp_path: Path, method: str) -> None:
    """A spawned or forkserver child shares its parent's resource tracker (its fd inherited,
    no PID of its own); stopping it raised TypeError from resource_tracker._stop. The run
    stops only what it started, and the report names no removed directory."""
    seen, _ = _run(tmp_path, _IN_A_CHILD, method)
    assert seen == {"line": "(True, ['resume_1', 'half_written_1'], 'None')"}, seen


def test_a_fork_server_the_caller_runs_is_left_running(tmp_path: Path) -> None:
    """The caller's own fork server (a forkserver Pool; Python 3.14's default start method) was
    used as the run's and stopped at its end. It is left running, for the caller's next pool,
    and the run spawns its workers instead."""
    seen, _ = _run(tmp_path, _BESIDE_ITS_SERVER)
    assert seen == {"line": "(True, True, True)"}, seen


def test_ten_calls_in_a_row_leave_the_temporary_directory_as_they_found_it(
    tmp_path: Path,
) -> None:
    """Each call without output_dir left its evidence (a dcp-invariant-XXXXXXXX directory) in
    the temporary directory for good. Now it is removed once the report is built; the fork
    server each call started is stopped, and no child is left, after every call."""
    seen, temp = _run(tmp_path, _IN_A_ROW)
    calls = seen["calls"]
    assert len(calls) == 10, calls
    # The bytes in the temporary directory before the first call and after each: before the
    # fix, about 100 kB more a call here (1.4 MB for the README's example at world sizes 1, 2).
    assert [call["bytes"] for call in calls] == [seen["before"]] * 10, (seen["before"], calls)
    for call in calls:
        assert call["passed"] is True and call["artifact"] == "None", call
        assert "evidence in" not in call["summary"], call
        # Only multiprocessing's pymp-* directory stays, for the process's life.
        assert call["entries"] == [] and call["server"] is None, call
        assert call["children"] == [], call
    assert list(temp.iterdir()) == []  # and once it has ended, nothing at all
