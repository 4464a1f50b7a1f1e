"""Fixtures whose module imports a library torch does not (click, in site-packages): each worker
records, as the module loads, whether the library was imported before it, into the directory
``PRELOAD_RECORDS`` names (tests/suite/test_fixture_imports_live.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

_BEFORE = "click" in sys.modules
import click  # noqa: E402  (after the look at sys.modules, on purpose)
from fixture_loops import Correct  # noqa: E402

RECORDS_ENV = "PRELOAD_RECORDS"

Path(os.environ[RECORDS_ENV], f"{os.getpid()}-{__name__}").write_text(
    "preloaded" if _BEFORE else "imported here", encoding="utf-8"
)
assert click.__name__ == "click"


def fixture(rank: int, world_size: int) -> Correct:
    return Correct(rank, world_size)
