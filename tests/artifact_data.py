"""The checked-in artifact under tests/data/artifact, a real run's output
(``dcp-invariant run --source-revision 0123456789abcdef0123456789abcdef01234567``), and readers
for it: torch-free tests derive every good and bad artifact from it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from dcp_invariant import canonical, plan
from dcp_invariant.evidence import schema
from dcp_invariant.suite.output_dir import Reservation

DATA_ARTIFACT = Path(__file__).parent / "data" / "artifact"

Observations = dict[str, dict[str, Any]]
# The ``rebuild`` fixture (conftest.py): an artifact built from mutated copies of the observations.
Rebuild = Callable[[Callable[[Observations], None]], Path]


def write_artifact(target: Path, files: dict[str, bytes]) -> None:
    """Write an artifact as ``run`` does: reserved, staged, renamed into place."""
    reservation = Reservation(target)
    try:
        reservation.fill(files)
    finally:
        reservation.release()


def read_observations(directory: Path) -> Observations:
    return {
        name: canonical.loads((directory / schema.observation_file(name)).read_bytes())
        for name in plan.SCENARIO_NAMES
    }


def read_provenance(directory: Path) -> dict[str, Any]:
    return cast(dict[str, Any], canonical.loads((directory / schema.PROVENANCE_FILE).read_bytes()))
