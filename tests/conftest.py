"""Shared fixtures. The checked-in artifact under tests/data/artifact is a real run's output
(``dcp-invariant run --source-revision 0123456789abcdef0123456789abcdef01234567``); torch-free
tests derive every good and bad artifact from it."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dcp_invariant import artifact, canonical, schema

DATA_ARTIFACT = Path(__file__).parent / "data" / "artifact"

Observations = dict[str, dict[str, Any]]


def read_observations(directory: Path) -> Observations:
    return {
        name: canonical.loads((directory / schema.observation_file(name)).read_bytes())
        for name in schema.SCENARIO_NAMES
    }


def read_provenance(directory: Path) -> dict[str, Any]:
    return canonical.loads((directory / schema.PROVENANCE_FILE).read_bytes())


@pytest.fixture
def data_artifact() -> Path:
    return DATA_ARTIFACT


@pytest.fixture
def artifact_copy(tmp_path: Path) -> Path:
    """A writable copy of the checked-in artifact."""
    target = tmp_path / "artifact"
    shutil.copytree(DATA_ARTIFACT, target)
    return target


@pytest.fixture
def rebuild(tmp_path: Path) -> Callable[[Callable[[Observations], None]], Path]:
    """Build a new, internally consistent artifact from mutated copies of the real observations.

    The result is valid (results, summary, JUnit and manifest re-derived), so what it tests is
    the verdict the rules give, not the verifier's integrity checks.
    """
    counter = iter(range(1_000_000))

    def make(mutate: Callable[[Observations], None]) -> Path:
        observations = read_observations(DATA_ARTIFACT)
        mutate(observations)
        target = tmp_path / f"rebuilt-{next(counter)}"
        artifact.write(target, artifact.build(observations, read_provenance(DATA_ARTIFACT)))
        return target

    return make
