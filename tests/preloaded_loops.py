"""A fixture whose module opens by importing a library torch does not (pluggy, which pytest
requires, so it is in site-packages wherever the tests run): each worker records whether that
library was imported before this module, into the directory ``PRELOAD_RECORDS`` names
(tests/suite/test_fixture_imports_live.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pluggy
from fixture_loops import Correct

RECORDS_ENV = "PRELOAD_RECORDS"

# sys.modules keeps the order modules began to load in, and this module's began before its own
# imports ran: a library found earlier was there before it (the fork server's).
_order = list(sys.modules)
Path(os.environ[RECORDS_ENV], f"{os.getpid()}-{__name__}").write_text(
    "preloaded" if _order.index(pluggy.__name__) < _order.index(__name__) else "imported here",
    encoding="utf-8",
)


def fixture(rank: int, world_size: int) -> Correct:
    return Correct(rank, world_size)
