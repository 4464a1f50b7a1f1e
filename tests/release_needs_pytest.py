"""A fixture whose module imports what only the runner's environment has (pytest, here): the
other release's environment holds torch, NumPy and dcp-invariant only, so --resume-with-torch
must refuse it before any scenario (tests/suite/test_cross_release_live.py)."""

import pytest  # noqa: F401  # present where the tests run, absent from the other release's
from release_loops import renamed_by_release as fixture  # noqa: F401
