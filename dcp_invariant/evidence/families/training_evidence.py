"""The training family: the registered fixture resumed from a committed save, at the same or
another world size."""

from __future__ import annotations

from dcp_invariant import plan
from dcp_invariant.evidence.checks import integer, optional, record, string
from dcp_invariant.evidence.families.groups import _consensus, _group
from dcp_invariant.evidence.families.promotion import _committed, commit_at_baseline
from dcp_invariant.evidence.families.record_parts import (
    Obs,
    _common,
    _load_fields,
    always,
    commit,
    digests,
    group,
    step,
)
from dcp_invariant.evidence.families.training_source import (
    _resumed,
    _training_source,
    source_sightings,
    training_source_rank,
)

training_target_rank = record(**_load_fields, loaded=optional(digests), next=optional(step))

SHAPE = record(
    **_common,
    fixture=string,
    steps_before_save=integer(0),
    source=group(training_source_rank),
    commit=optional(commit),
    target=optional(group(training_target_rank)),
)

shape_for = always(SHAPE)


def rule(scenario: plan.Scenario, obs: Obs) -> list[str]:
    reasons, saved, reference = _training_source(obs, scenario.source_world_size)
    # The registered fixture replicates its state on every rank (README, "Limits"), and these
    # scenarios load it at another world size: there, and only there, ranks must agree, and
    # every resumed rank is held to the first complete source rank's state.
    reasons += _consensus(list(saved.values()), "source: saved state")
    reasons += _consensus(list(reference.values()), "source: uninterrupted next step")
    first = min(saved, default=None)
    commit = obs["commit"]
    if commit is None:
        return [*reasons, "commit: did not run"]
    reasons += _committed(commit, scenario.source_world_size)
    target = obs["target"]
    if target is None:
        return [*reasons, "target: did not run"]
    reasons += _group(target, scenario.target_world_size, "target")
    for rank in target["ranks"]:
        reasons += _resumed(
            rank,
            commit,
            saved.get(first) if first is not None else None,
            reference.get(first) if first is not None else None,
            f"target rank {rank['rank']}",
        )
    return reasons


commits = commit_at_baseline
sightings = source_sightings
