"""The scenario drivers, by family. Drivers import no torch; workers do."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dcp_invariant.suite.scenarios import (
    cross_release,
    damaged,
    dtensor,
    elastic,
    half_written,
    rank_exit,
    reshard,
    resume,
    training,
)
from dcp_invariant.suite.scenarios.common import ScenarioContext

Driver = Callable[[ScenarioContext], dict[str, Any]]

DRIVERS: dict[str, Driver] = {
    "training": training.run,
    "dtensor": dtensor.run,
    "elastic": elastic.run,
    "rank_exit": rank_exit.run,
    "damaged": damaged.run,
    "resume": resume.run,
    "reshard": reshard.run,
    "async_resume": resume.run,
    "half_written": half_written.run,
    "cross_release": cross_release.run,
}
