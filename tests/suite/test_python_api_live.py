"""dcp_invariant.check() for real: a report that names the cause, and the pytest plugin in a
pytest of its own (a user's test suite). That check() writes the CLI's artifact is tested in
test_fixture_live.py, beside the CLI run it compares with."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runs import REVISION

import dcp_invariant
from dcp_invariant.evidence import diagnosis, schema
from dcp_invariant.evidence.verify import verify_artifact

pytestmark = pytest.mark.live

TESTS = Path(__file__).resolve().parents[1]
EXAMPLES = TESTS.parent / "examples"
PYTEST_TIMEOUT = 1200


def test_check_of_a_buggy_loop_ranks_the_cause_and_keeps_the_evidence(tmp_path: Path) -> None:
    report = dcp_invariant.check(
        "fixture_loops:rng_outside_state",
        world_sizes=[1],
        source_revision=REVISION,
        output_dir=tmp_path / "evidence",
    )
    assert not report.passed
    assert report.diagnoses[0].cause == diagnosis.OUTSIDE_STATE_DICT
    assert "resume_1" in report.diagnoses[0].scenarios
    assert str(report).startswith("dcp-invariant: fail: ")
    # The output_dir given is kept and named (without one, see test_check_anywhere_live.py).
    assert report.artifact == tmp_path / "evidence" and verify_artifact(report.artifact).valid
    assert str(report).splitlines()[0].endswith(f"; evidence in {report.artifact}")


# One world size: the bug shows at the first resume, and a second size would only add the
# torchrun restart's fresh interpreters (about 15 CPU-s) to each of the two runs of this test.
_BUGGY_TEST = """

def test_resume_of_the_buggy_copy(dcp_invariant):
    dcp_invariant.check("examples.buggy_mlp_fixture:fixture", world_sizes=[1])
"""


def _readme_plugin_test() -> str:
    """The README's plugin example, verbatim: what it shows is what runs here."""
    text = (TESTS.parent / "README.md").read_text(encoding="utf-8")
    pattern = r"^```\n(def test_resume\(dcp_invariant\):\n.*?)^```$"
    [block] = re.findall(pattern, text, re.M | re.S)
    return str(block)


def test_the_pytest_plugin_in_a_users_test_suite_run_with_xdist(tmp_path: Path) -> None:
    """Under pytest-xdist, which a suite that runs the check in two tests uses, and which each
    assertion below holds in without it too: the serial run's path is the same fixture's."""
    pytest.importorskip("xdist", reason="pytest-xdist is not installed")
    parallel = ["-n", "2"]
    project = tmp_path / "project"
    (project / "examples").mkdir(parents=True)
    for example in ("mlp_fixture.py", "buggy_mlp_fixture.py"):
        (project / "examples" / example).write_bytes((EXAMPLES / example).read_bytes())
    (project / "test_resume.py").write_text(_readme_plugin_test() + _BUGGY_TEST, encoding="utf-8")
    env = {**os.environ, "GITHUB_SHA": REVISION, "PYTHONPATH": str(project)}
    done = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-p", "no:randomly", "-p", "no:cacheprovider",
            "--basetemp", str(tmp_path / "base"), *parallel, "test_resume.py",
        ],
        capture_output=True, text=True, timeout=PYTEST_TIMEOUT, cwd=project, env=env, check=False,
    )  # fmt: skip
    out = done.stdout

    assert done.returncode == 1, out + done.stderr
    assert "1 failed, 1 passed" in out, out
    # The failure is an assertion whose message is the diagnosis, cause class first.
    assert "AssertionError: dcp-invariant: fail: " in out, out
    assert f"{diagnosis.OUTSIDE_STATE_DICT} (resume_1" in out, out
    # Each check's evidence lands under its own test's tmp_path, whole.
    artifacts = sorted((tmp_path / "base").rglob(schema.MANIFEST_FILE))
    assert len(artifacts) == 2, artifacts
    assert len({a.parent.parent for a in artifacts}) == 2
    assert all(verify_artifact(a.parent).valid for a in artifacts)


# A user's script that calls check() with no `if __name__ == "__main__":` guard. The fixture is
# an app that saves itself, at world size 1: two scenarios, the fewest a fixture run has.
_UNGUARDED = """
import dcp_invariant
report = dcp_invariant.check("saving_loops:saves_itself", world_sizes=[1])
print("verdict:", "pass" if report.passed else report)
"""


@pytest.mark.parametrize(
    ("start_method", "source"),
    [
        ("forkserver", "file"),
        ("forkserver", "stdin"),
        ("forkserver", "-c"),  # as a notebook's: a __main__ with no file
        ("spawn", "file"),
        ("spawn", "stdin"),
    ],
)
def test_check_never_runs_its_callers_main_again(
    tmp_path: Path, start_method: str, source: str
) -> None:
    """multiprocessing gives every process it starts the caller's main module to run again
    (multiprocessing/spawn.py): an unguarded script would check again in every worker, and one
    read from standard input fails on the file '<stdin>'. Neither happens, on either path."""
    if start_method == "forkserver" and sys.platform != "linux":
        pytest.skip("the fork server is the Linux path")
    script = tmp_path / "check_it.py"
    script.write_text(_UNGUARDED, encoding="utf-8")
    command = {
        "file": [sys.executable, str(script)],
        "stdin": [sys.executable, "-"],
        "-c": [sys.executable, "-c", _UNGUARDED],
    }[source]
    env = {
        **os.environ,
        "GITHUB_SHA": REVISION,
        "PYTHONPATH": str(TESTS),
        "DCP_INVARIANT_START_METHOD": start_method,
    }
    done = subprocess.run(
        command, input=_UNGUARDED if source == "stdin" else None, capture_output=True,
        text=True, timeout=PYTEST_TIMEOUT, cwd=tmp_path, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    # Once: a worker that ran the script again would have printed a verdict of its own.
    assert done.stdout.count("verdict:") == 1 and "verdict: pass" in done.stdout, done.stdout
