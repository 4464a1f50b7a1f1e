"""The pytest plugin (entry point ``pytest11``): a fixture named ``dcp_invariant``.

    def test_resume(dcp_invariant):
        dcp_invariant.check("pkg.mod:make_app", world_sizes=[1, 2])

    def test_my_job_resumes(dcp_invariant):
        dcp_invariant.check_job("python train.py --out {run_dir}", final="final.pt")

A failed check fails the test with an ``AssertionError`` whose message is the report (the
diagnosis; for ``check_job``, ``preempt``'s report grouped by cause); a passing one returns the
:class:`~dcp_invariant.Report` or :class:`~dcp_invariant.JobReport`. Each check writes its
evidence under the test's own ``tmp_path``, so parallel workers (pytest-xdist) never share a
directory. pytest loads this module only where pytest runs: the package does not depend on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from dcp_invariant.errors import BadInput
from dcp_invariant.python_api import JobReport, Report, check, check_job

_Checked = TypeVar("_Checked", Report, JobReport)


class Checker:
    """What the ``dcp_invariant`` fixture gives a test."""

    def __init__(self, home: Path) -> None:
        self._home = home
        self._count = 0

    def check(self, fixture: str | Callable[..., Any], **options: Any) -> Report:
        """:func:`dcp_invariant.check` with the evidence under ``tmp_path``; a failure fails the
        test with the diagnosis, bad input fails it with the one line that says what to change."""
        __tracebackhide__ = True  # the test's line is the one to show, not this module's
        return self._checked(check, fixture, options)

    def check_job(self, command: str | Sequence[str], **options: Any) -> JobReport:
        """:func:`dcp_invariant.check_job` (``preempt``: your own command, ``{run_dir}`` in it,
        killed at its saves and relaunched) with the evidence under ``tmp_path``; a failure fails
        the test with the report grouped by cause, bad input with its one line."""
        __tracebackhide__ = True
        return self._checked(check_job, command, options)

    def _checked(
        self, run: Callable[..., _Checked], what: object, options: dict[str, Any]
    ) -> _Checked:
        """``run(what, **options)``, each call writing to a directory of its own (a test's own
        ``output_dir`` stays): the report when it passed, else the test fails."""
        __tracebackhide__ = True
        self._count += 1
        options.setdefault("output_dir", self._home / f"dcp-invariant-{self._count}")
        try:
            report = run(what, **options)
        except BadInput as exc:
            refused = str(exc)
        else:
            if not report.passed:
                raise AssertionError(str(report))
            return report
        # Outside the except block: failed inside it, the test would show the BadInput being
        # handled too, and "During handling of the above exception, another exception occurred".
        pytest.fail(f"dcp-invariant: bad input: {refused}", pytrace=False)


@pytest.fixture
def dcp_invariant(tmp_path: Path) -> Checker:
    """Checks a training loop's checkpoint resume: ``dcp_invariant.check("pkg.mod:make_app")``,
    or your own job's: ``dcp_invariant.check_job("python train.py --out {run_dir}")``."""
    return Checker(tmp_path)
