"""The training family: the registered fixture resumed from a committed save, at the same or
another world size."""

from __future__ import annotations

from dcp_invariant import plan
from dcp_invariant.evidence.checks import integer, optional, record, string
from dcp_invariant.evidence.families._groups import consensus
from dcp_invariant.evidence.families._promotion import (
    commit_at_baseline,
    committed_then_loaded,
)
from dcp_invariant.evidence.families._record_parts import (
    Obs,
    always,
    commit,
    common_fields,
    digests,
    group,
    load_fields,
    step,
)
from dcp_invariant.evidence.families._training_source import (
    lost_at_load,
    resumed,
    saved_and_stepped,
    source_sightings,
    training_source_rank,
)

training_target_rank = record(**load_fields, loaded=optional(digests), next=optional(step))

SHAPE = record(
    **common_fields,
    fixture=string,
    steps_before_save=integer(0),
    source=group(training_source_rank),
    commit=optional(commit),
    target=optional(group(training_target_rank)),
)

shape_for = always(SHAPE)


def rule(scenario: plan.Scenario, obs: Obs) -> list[str]:
    reasons, saved, reference = saved_and_stepped(obs, scenario.source_world_size)
    # The registered fixture replicates its state on every rank (docs/registered-suite.md), and
    # these scenarios load it at another world size: there, and only there, ranks must agree,
    # and every resumed rank is held to the first complete source rank's state.
    reasons += consensus(list(saved.values()), "source: saved state")
    reasons += consensus(list(reference.values()), "source: uninterrupted next step")
    first = min(saved, default=None)
    loaded, commit, target = committed_then_loaded(scenario, obs)
    reasons += loaded
    if commit is None or target is None:
        return reasons
    expected = saved.get(first) if first is not None else None
    # The registered fixture is replicated: no rank's saved state is another's copy to keep.
    after = reference.get(first) if first is not None else None
    lost = {
        r["rank"] for r in target["ranks"] if lost_at_load(r, expected, after, user_fixture=False)
    }
    for rank in target["ranks"]:
        reasons += resumed(
            rank,
            commit,
            expected,
            after,
            f"target rank {rank['rank']}",
            scenario,
            others_lost=bool(lost - {rank["rank"]}),
        )
    return reasons


commits = commit_at_baseline
sightings = source_sightings
