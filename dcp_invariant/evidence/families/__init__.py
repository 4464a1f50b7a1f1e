"""Every scenario family's evidence, one module a family, behind one record type.

Shaped like pypa/cibuildwheel's ``platforms`` package (cibuildwheel/platforms/__init__.py): each
family module defines the same members, and :data:`FAMILIES` maps each ``plan.Family`` to its
module, so :mod:`dcp_invariant.evidence.rules` and :mod:`dcp_invariant.evidence.observation`
look a family up rather than name one.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Protocol

from dcp_invariant import plan
from dcp_invariant.evidence.checks import Check
from dcp_invariant.evidence.families import (
    async_resume_evidence,
    cross_release_evidence,
    damaged_evidence,
    dtensor_evidence,
    elastic_evidence,
    half_written_evidence,
    rank_exit_evidence,
    reshard_evidence,
    resume_evidence,
    training_evidence,
)
from dcp_invariant.evidence.families._record_parts import Obs
from dcp_invariant.evidence.families._sightings import Sightings


class Family(Protocol):
    """What a family's module defines: the module itself is the record (PEP 544 applies a
    protocol to a module, ignoring ``self``)."""

    def shape_for(self, run_plan: plan.Plan) -> Check:
        """The shape of the family's observation record in a run of ``run_plan``."""
        ...

    def rule(self, scenario: plan.Scenario, obs: Obs) -> list[str]:
        """The reasons a (shape-checked) observation of ``scenario`` fails; none when it passes."""
        ...

    def commits(self, run_plan: plan.Plan) -> list[tuple[str, str]]:
        """``(key, checkpoint label)`` of each commit the family's driver makes, in order."""
        ...

    def sightings(self, seen: Sightings, name: str, obs: Obs, run_plan: plan.Plan) -> None:
        """Add what ``obs`` recorded that its sibling scenarios must have recorded alike."""
        ...


FAMILIES: Final[Mapping[plan.Family, Family]] = MappingProxyType(
    {
        "training": training_evidence,
        "dtensor": dtensor_evidence,
        "elastic": elastic_evidence,
        "rank_exit": rank_exit_evidence,
        "damaged": damaged_evidence,
        "resume": resume_evidence,
        "reshard": reshard_evidence,
        "async_resume": async_resume_evidence,
        "half_written": half_written_evidence,
        "cross_release": cross_release_evidence,
    }
)
