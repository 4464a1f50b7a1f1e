"""As tests/preloaded_loops.py, but the library is imported inside the fixture, not as the
module loads: nothing of it is preloaded, and each worker imports it itself."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from fixture_loops import Correct

RECORDS_ENV = "PRELOAD_RECORDS"


def fixture(rank: int, world_size: int) -> Correct:
    before = "pluggy" in sys.modules
    import pluggy

    Path(os.environ[RECORDS_ENV], f"{os.getpid()}-{__name__}").write_text(
        "preloaded" if before else "imported here", encoding="utf-8"
    )
    assert pluggy.__name__ == "pluggy"
    return Correct(rank, world_size)
