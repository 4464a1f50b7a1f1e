"""The pytest plugin (entry point ``pytest11``): a fixture named ``dcp_invariant``.

    def test_resume(dcp_invariant):
        dcp_invariant.check("pkg.mod:make_app", world_sizes=[1, 2])

A failed check fails the test with an ``AssertionError`` whose message is the report's
diagnosis; a passing one returns the :class:`~dcp_invariant.Report`. Each check writes its
evidence under the test's own ``tmp_path``, so parallel workers (pytest-xdist) never share a
directory. pytest loads this module only where pytest runs: the package does not depend on it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dcp_invariant.errors import BadInput
from dcp_invariant.python_api import Report, check


class Checker:
    """What the ``dcp_invariant`` fixture gives a test."""

    def __init__(self, home: Path) -> None:
        self._home = home
        self._count = 0

    def check(self, fixture: str | Callable[..., Any], **options: Any) -> Report:
        """:func:`dcp_invariant.check` with the evidence under ``tmp_path``; a failure fails the
        test with the diagnosis, bad input fails it with the one line that says what to change."""
        __tracebackhide__ = True  # the test's line is the one to show, not this module's
        self._count += 1
        options.setdefault("output_dir", self._home / f"dcp-invariant-{self._count}")
        try:
            report = check(fixture, **options)
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
    """Checks a training loop's checkpoint resume: ``dcp_invariant.check("pkg.mod:make_app")``."""
    return Checker(tmp_path)
