"""Values that must be equal wherever a run recorded them: how scenarios are held to each other.

Each family adds what its observation saw (its module's ``sightings``);
:func:`dcp_invariant.evidence.rules.consistency` reports where they disagree.
"""

from __future__ import annotations

from collections import Counter
from typing import Any


class Sightings:
    """Values that must be equal wherever they were recorded, grouped by what they are."""

    def __init__(self) -> None:
        self.groups: dict[str, list[tuple[str, str, Any]]] = {}

    def add(self, what: str, name: str, where: str, value: Any) -> None:
        if value is not None:
            self.groups.setdefault(what, []).append((name, where, value))

    def disagreements(self) -> dict[str, list[str]]:
        """A reason for each sighting that differs from the value most sightings agree on."""
        out: dict[str, list[str]] = {}
        for what, seen in self.groups.items():
            # Values of one shape-checked type each, so == is exact; few distinct ones.
            distinct: list[Any] = []
            kinds: list[int] = []
            for _, _, value in seen:
                kind = next((i for i, d in enumerate(distinct) if d == value), len(distinct))
                if kind == len(distinct):
                    distinct.append(value)
                kinds.append(kind)
            counts = Counter(kinds)
            # The most common value; on a tie, the one recorded first in plan order.
            agreed = max(counts, key=lambda k: (counts[k], -k))
            backers = sorted(
                {name for (name, _, _), k in zip(seen, kinds, strict=True) if k == agreed}
            )
            shown = ", ".join(backers[:3]) + (
                f" (+{len(backers) - 3} more)" if len(backers) > 3 else ""
            )
            for (name, where, _), kind in zip(seen, kinds, strict=True):
                if kind != agreed:
                    out.setdefault(name, []).append(
                        f"consistency: {where} is not {what} recorded in {shown}: the same "
                        "fixture, trained the same steps, must give the same; the run is not "
                        "deterministic or this observation was edited"
                    )
        return out
