"""The pytest plugin: the ``dcp_invariant`` fixture a user's test gets, where each check's
evidence goes, and what a test shows when a check passes, fails or is given bad input.

A user's test file runs in a pytest of its own (pytester). Only bad input reaches the real
:func:`dcp_invariant.check`, which refuses it before anything runs; elsewhere ``check`` is
replaced by one returning a report built from the package's own types, without torch:
tests/suite/test_python_api_live.py runs the plugin on real checks, and the one live test here
runs ``check_job`` on a real job.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any, Generic, TypeVar

import pytest

from dcp_invariant import JobReport, Report, ScenarioResult, pytest_plugin, python_api
from dcp_invariant.evidence import diagnosis
from dcp_invariant.pytest_plugin import Checker

pytest_plugins = ["pytester"]

REASON = f"{diagnosis.OUTSIDE_STATE_DICT}: app.rng differs after the resume"


def report_of(failed: bool, artifact: Path | None) -> Report:
    """A report as check() returns one: two scenarios, the resume failed or not."""
    results = {
        "checkpoint_1": ScenarioResult("checkpoint_1", "pass", ()),
        "resume_1": ScenarioResult("resume_1", "fail", (REASON,))
        if failed
        else ScenarioResult("resume_1", "pass", ()),
    }
    return Report(
        not failed, MappingProxyType(results), python_api.ranked(results.values()), artifact
    )


R = TypeVar("R")


class Fake(Generic[R]):
    """Stands in for dcp_invariant.check or check_job: records each call, returns a report
    (made by ``made``) whose evidence is in the output directory it was given, as the real
    ones do."""

    def __init__(self, made: Callable[[bool, Path], R], failed: bool = False) -> None:
        self.made, self.failed = made, failed
        self.calls: list[tuple[object, dict[str, Any]]] = []
        self.reports: list[R] = []

    def __call__(self, what: object, **options: Any) -> R:
        self.calls.append((what, options))
        self.reports.append(self.made(self.failed, Path(options["output_dir"])))
        return self.reports[-1]


def FakeCheck(failed: bool = False) -> Fake[Report]:  # reads as the class it makes
    return Fake(report_of, failed)


# --- the Checker a test gets ---------------------------------------------------------------


def test_each_check_writes_to_a_directory_of_its_own_under_the_tests_tmp_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeCheck()
    monkeypatch.setattr(pytest_plugin, "check", fake)
    checker = Checker(tmp_path)
    first = checker.check("pkg.mod:make_app", world_sizes=[1, 2])
    second = checker.check("pkg.mod:other", output_dir=tmp_path / "mine")
    third = checker.check("pkg.mod:make_app")

    assert fake.calls == [
        ("pkg.mod:make_app", {"world_sizes": [1, 2], "output_dir": tmp_path / "dcp-invariant-1"}),
        ("pkg.mod:other", {"output_dir": tmp_path / "mine"}),  # the test's own choice stays
        ("pkg.mod:make_app", {"output_dir": tmp_path / "dcp-invariant-3"}),
    ]
    # A passing check returns its report.
    assert [first, second, third] == fake.reports
    assert all(report.passed for report in fake.reports)


def test_a_failed_check_raises_an_assertion_error_whose_message_is_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeCheck(failed=True)
    monkeypatch.setattr(pytest_plugin, "check", fake)
    with pytest.raises(AssertionError) as caught:
        Checker(tmp_path).check("pkg.mod:make_app")
    [report] = fake.reports
    assert str(caught.value) == str(report)
    assert str(caught.value).startswith("dcp-invariant: fail: 1 passed, 1 failed; evidence in ")
    assert f"  - {REASON}" in str(caught.value).splitlines()


def test_bad_input_fails_the_test_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    with pytest.raises(pytest.fail.Exception) as caught:
        Checker(tmp_path).check("pkg.mod:make_app", world_sizes="12")
    assert (
        caught.value.msg == "dcp-invariant: bad input: world sizes '12': give integers, e.g. (1, 2)"
    )
    assert caught.value.pytrace is False
    # Nothing chained: pytest would show the BadInput's message too, as a line of its own.
    assert caught.value.__context__ is None and caught.value.__cause__ is None
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


# --- what a user's test run shows ------------------------------------------------------------


def run_user_tests(pytester: pytest.Pytester) -> pytest.RunResult:
    """The user's test file, in a pytest of its own whose temp directories are under
    ``pytester.path / "basetemp"``."""
    return pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", f"--basetemp={pytester.path / 'basetemp'}"
    )


USER_TESTS = """
def test_two_checks(dcp_invariant, tmp_path):
    first = dcp_invariant.check("pkg.mod:make_app", world_sizes=[1])
    second = dcp_invariant.check("pkg.mod:make_app")
    assert first.passed and second.passed
    assert first.artifact == tmp_path / "dcp-invariant-1"
    assert second.artifact == tmp_path / "dcp-invariant-2"

def test_another_check(dcp_invariant, tmp_path):
    assert dcp_invariant.check("pkg.mod:make_app").artifact == tmp_path / "dcp-invariant-1"
"""


def test_a_users_tests_get_the_fixture_and_each_its_own_directories(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeCheck()
    monkeypatch.setattr(pytest_plugin, "check", fake)
    pytester.makepyfile(test_user=USER_TESTS)
    result = run_user_tests(pytester)
    result.assert_outcomes(passed=2)
    directories = [options["output_dir"] for _, options in fake.calls]
    assert len(set(directories)) == 3
    assert directories[0].parent == directories[1].parent != directories[2].parent
    assert all(d.is_relative_to(pytester.path / "basetemp") for d in directories)


def test_a_users_failed_check_shows_the_report_at_the_tests_own_line(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeCheck(failed=True)
    monkeypatch.setattr(pytest_plugin, "check", fake)
    pytester.makepyfile(
        test_user="""
        def test_resume(dcp_invariant):
            dcp_invariant.check("pkg.mod:make_app")
        """
    )
    result = run_user_tests(pytester)
    result.assert_outcomes(failed=1)
    [report] = fake.reports
    first, *rest = str(report).splitlines()
    shown = ["E       AssertionError: " + first] + ["E       " + line for line in rest]
    lines = result.outlines
    start = lines.index(shown[0])
    assert lines[start : start + len(shown)] == shown
    # The frame shown is the test's; the plugin's own is hidden (__tracebackhide__).
    assert '>       dcp_invariant.check("pkg.mod:make_app")' in lines
    assert not [line for line in lines if "pytest_plugin.py" in line or "raise Assert" in line]


def test_a_users_bad_input_fails_with_one_line_and_no_traceback(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(
        test_user="""
        def test_resume(dcp_invariant):
            dcp_invariant.check("pkg.mod:make_app", world_sizes="12")
        """
    )
    result = run_user_tests(pytester)
    result.assert_outcomes(failed=1)
    lines = result.outlines
    header = next(i for i, line in enumerate(lines) if "test_resume" in line and "___" in line)
    end = next(i for i, line in enumerate(lines) if "short test summary info" in line)
    failure = [line for line in lines[header + 1 : end] if line.strip()]
    assert failure == ["dcp-invariant: bad input: world sizes '12': give integers, e.g. (1, 2)"], (
        failure
    )
    assert (pytester.path / "basetemp").is_dir()
    assert not list((pytester.path / "basetemp").rglob("dcp-invariant-*"))  # nothing written


# --- check_job: the user's own command under preempt -----------------------------------------

JOB_FAILURE = [
    "preempt: 9 file operations (ranks main), 4 crash points relaunched; the uninterrupted run "
    "reached step 4",
    f"FAIL  {diagnosis.CANNOT_RESUME}: at 1 of 4 crash points",
    "      - killed before rank main operation 2 (write ckpt.pt), after step 2: the relaunch "
    "exited 1",
    "ok    3 crash points: rank main operation 0 (open ckpt.pt), after step 2",
    "summary: 3 passed, 1 failed",
]


def job_report_of(failed: bool, output_dir: Path | None) -> JobReport:
    """A report as check_job() returns one: four crash points, one failed or none."""
    reasons = (f"{diagnosis.CANNOT_RESUME}: killed before ...",) if failed else ()
    points = (python_api.CrashPoint("rank main operation 2 (write ckpt.pt)", reasons),)
    evidence = None if output_dir is None else output_dir / "preempt.json"
    lines = JOB_FAILURE if failed else [*JOB_FAILURE[:1], "summary: 4 passed, 0 failed"]
    return JobReport(not failed, points, (), evidence, tuple(lines))


def FakeCheckJob(failed: bool = False) -> Fake[JobReport]:  # as FakeCheck
    return Fake(job_report_of, failed)


def test_each_check_job_writes_to_a_directory_of_its_own_numbered_with_the_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_job, fake = FakeCheckJob(), FakeCheck()
    monkeypatch.setattr(pytest_plugin, "check_job", fake_job)
    monkeypatch.setattr(pytest_plugin, "check", fake)
    checker = Checker(tmp_path)
    first = checker.check_job("python train.py {run_dir}", final="final.pt", crash_points=4)
    checker.check("pkg.mod:make_app")
    third = checker.check_job(["python", "train.py", "{run_dir}"], output_dir=tmp_path / "mine")
    fourth = checker.check_job("python train.py {run_dir}")

    assert fake_job.calls == [
        (
            "python train.py {run_dir}",
            {"final": "final.pt", "crash_points": 4, "output_dir": tmp_path / "dcp-invariant-1"},
        ),
        (["python", "train.py", "{run_dir}"], {"output_dir": tmp_path / "mine"}),
        ("python train.py {run_dir}", {"output_dir": tmp_path / "dcp-invariant-4"}),
    ]
    assert fake.calls == [("pkg.mod:make_app", {"output_dir": tmp_path / "dcp-invariant-2"})]
    # A passing check returns its report.
    assert [first, third, fourth] == fake_job.reports
    assert first.evidence == tmp_path / "dcp-invariant-1" / "preempt.json"


def test_a_failed_check_job_raises_an_assertion_error_whose_message_is_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeCheckJob(failed=True)
    monkeypatch.setattr(pytest_plugin, "check_job", fake)
    with pytest.raises(AssertionError) as caught:
        Checker(tmp_path).check_job("python train.py {run_dir}")
    [report] = fake.reports
    assert str(caught.value) == str(report) == "\n".join(JOB_FAILURE)


@pytest.mark.parametrize(
    ("command", "options", "line"),
    [
        (
            "python train.py --out runs",
            {},
            "the command has no {run_dir}: put it where the job takes the directory it writes "
            "its checkpoints to (e.g. --output-dir {run_dir}); each launch gets a fresh one",
        ),
        (
            "python train.py {run_dir}",
            {"crash_points": "4"},
            "crash_points must be an int, got str '4'",
        ),
    ],
)
def test_check_job_bad_input_fails_the_test_with_one_line_and_no_traceback(
    tmp_path: Path, command: str, options: dict[str, Any], line: str
) -> None:
    with pytest.raises(pytest.fail.Exception) as caught:
        Checker(tmp_path).check_job(command, **options)
    assert caught.value.msg == f"dcp-invariant: bad input: {line}"
    assert caught.value.pytrace is False
    assert caught.value.__context__ is None and caught.value.__cause__ is None
    assert list(tmp_path.iterdir()) == []  # refused before anything was written


def test_a_users_failed_check_job_shows_the_report_at_the_tests_own_line(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeCheckJob(failed=True)
    monkeypatch.setattr(pytest_plugin, "check_job", fake)
    pytester.makepyfile(
        test_user="""
        def test_my_job_resumes(dcp_invariant, tmp_path):
            dcp_invariant.check_job("python train.py {run_dir}", final="final.pt")
        """
    )
    result = run_user_tests(pytester)
    result.assert_outcomes(failed=1)
    [(_, options)] = fake.calls
    assert options["output_dir"].is_relative_to(pytester.path / "basetemp")
    first, *rest = JOB_FAILURE
    shown = ["E       AssertionError: " + first] + ["E       " + line for line in rest]
    lines = result.outlines
    start = lines.index(shown[0])
    assert lines[start : start + len(shown)] == shown
    assert '>       dcp_invariant.check_job("python train.py {run_dir}", final="final.pt")' in lines
    assert not [line for line in lines if "pytest_plugin.py" in line or "raise Assert" in line]


JOBS = Path(__file__).resolve().parent / "preempt_jobs"
LIVE_TIMEOUT = 600

# A user's tests of their own job (tests/preempt_jobs/single_process.py): saved with torch.save
# straight onto ckpt.pt it cannot resume after a kill mid-write; replaced atomically it can.
# Few crash points, as tests/preempt/test_preempt_live.py has them: six reach into torch.save's
# writes; one save's rename is a point whatever the budget.
_JOB_TESTS = """
import shlex, sys

JOB = {job!r}

def test_in_place(dcp_invariant):
    dcp_invariant.check_job(
        [sys.executable, JOB, "{{run_dir}}", "--save", "in_place"],
        final="final.pt", crash_points=6, timeout=120,
    )

def test_atomic(dcp_invariant, tmp_path):
    command = shlex.join([sys.executable, JOB, "--save", "atomic", "--steps", "2", "{{run_dir}}"])
    report = dcp_invariant.check_job(command, final="final.pt", crash_points=3, timeout=120)
    assert report.passed and not [p for p in report.points if p.reasons]
    assert report.evidence == tmp_path / "dcp-invariant-1" / "preempt.json"
"""


@pytest.mark.live
@pytest.mark.skipif(sys.platform != "linux", reason="preempt runs on Linux only (LD_PRELOAD)")
def test_a_users_check_job_fails_on_a_job_that_cannot_resume_and_passes_on_one_that_can(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plugin on real preempt checks, in a pytest of its own as a user's suite runs."""
    scratch = pytester.path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))  # preempt's own scratch, to see it go
    pytester.makepyfile(test_job=_JOB_TESTS.format(job=str(JOBS / "single_process.py")))
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", f"--basetemp={pytester.path / 'basetemp'}",
        timeout=LIVE_TIMEOUT,
    )  # fmt: skip
    result.assert_outcomes(failed=1, passed=1)
    out = result.stdout.str()
    assert "E       AssertionError: preempt: " in out, out
    assert f"E       FAIL  {diagnosis.CANNOT_RESUME}: at " in out, out
    assert "E       summary: " in out, out
    # Each check's evidence under its own test's tmp_path, and verify derives it again.
    evidence = sorted((pytester.path / "basetemp").rglob("preempt.json"))
    assert [e.parent.name for e in evidence] == ["dcp-invariant-1"] * 2, evidence
    assert len({e.parents[1] for e in evidence}) == 2
    for directory in (e.parent for e in evidence):
        verified = subprocess.run(
            [sys.executable, "-m", "dcp_invariant", "verify", str(directory)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert verified.returncode in (0, 1) and verified.stdout.startswith(("FAIL", "pass")), (
            verified.stdout + verified.stderr
        )
    assert not [p for p in scratch.iterdir() if p.name.startswith("dcp-invariant-")]
