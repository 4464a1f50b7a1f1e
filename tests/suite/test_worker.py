"""A worker follows its parent: one whose parent died before it could ask to follow leaves at once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dcp_invariant.suite import worker

CHILD = (
    "import sys; from dcp_invariant.suite import worker; worker.die_with_parent({}); print('ran')"
)


def run_child(argument: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD.format(argument)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize(
    ("argument", "env", "runs"),
    [
        ("", {}, True),
        (str(os.getpid()), {}, True),
        # A parent that is not the one that started it: it was handed on (PID 1 or a subreaper).
        ("1", {}, False),
        ("", {worker.PARENT_PID_ENV: "1"}, False),
        ("", {worker.PARENT_PID_ENV: str(os.getpid())}, True),
    ],
    # Not the PIDs: ids must be alike in every pytest-xdist worker, each of its own PID.
    ids=["no-parent-given", "this-pid", "pid-1", "env-pid-1", "env-this-pid"],
)
def test_a_worker_whose_parent_is_not_the_one_that_started_it_leaves(
    argument: str, env: dict[str, str], runs: bool
) -> None:
    proc = run_child(argument, env)
    assert (proc.returncode, proc.stdout.strip()) == ((0, "ran") if runs else (1, "")), proc.stderr
