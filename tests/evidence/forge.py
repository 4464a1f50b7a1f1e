"""What a careful forger does after editing an observation: re-derive what the verifier derives.

Tests that mean to exercise a rule (not the integrity checks in front of it) finish their edits
with :func:`reaggregate`, so the edited record is still one a worker could have written.
"""

from __future__ import annotations

from typing import Any

from dcp_invariant import canonical
from dcp_invariant.evidence import observation


def reaggregate(value: Any) -> Any:
    """Recompute, in place, every ``aggregate`` of every component-digest object in ``value``."""
    if isinstance(value, dict):
        for child in value.values():
            reaggregate(child)
        if observation.AGGREGATE in value and all(
            isinstance(v, str) and canonical.HEX64.fullmatch(v) for v in value.values()
        ):
            value[observation.AGGREGATE] = observation.aggregate(value)
    elif isinstance(value, list):
        for child in value:
            reaggregate(child)
    return value
