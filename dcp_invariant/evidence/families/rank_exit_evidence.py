"""The rank_exit family: a rank dies in the middle of a save, and the candidate is never
promoted."""

from __future__ import annotations

from dcp_invariant import dcp_layout, plan
from dcp_invariant.evidence.checks import integer, record, string
from dcp_invariant.evidence.families._groups import consensus, rank_set, timed_out
from dcp_invariant.evidence.families._promotion import (
    baseline_and_candidate,
    exactly_dcp_files,
    refused_after_baseline,
)
from dcp_invariant.evidence.families._record_parts import (
    Obs,
    always,
    common_fields,
    exit_code,
)
from dcp_invariant.evidence.families._training_source import (
    refused_candidate_fields,
    source_sightings,
)

SHAPE = record(
    **common_fields,
    fixture=string,
    steps_before_save=integer(0),
    dying_rank=integer(0),
    planned_exit_code=exit_code,
    **refused_candidate_fields,
)

shape_for = always(SHAPE)


def rule(scenario: plan.Scenario, obs: Obs) -> list[str]:
    reasons: list[str] = []
    source = obs["source"]
    codes = source["exit_codes"]
    dying, planned = obs["dying_rank"], obs["planned_exit_code"]
    if (dying, planned) != (plan.DYING_RANK, plan.RANK_EXIT_CODE):
        reasons.append(
            f"plan: rank {dying} was to exit {planned}; the scenario defines rank {plan.DYING_RANK}, "
            f"code {plan.RANK_EXIT_CODE}"
        )
    if source["timed_out"]:
        reasons.append(timed_out("source"))
    if len(codes) != scenario.source_world_size:
        reasons.append(f"source: {len(codes)} exit codes for {scenario.source_world_size} ranks")
    elif not 0 <= dying < len(codes):
        reasons.append(f"source: the dying rank {dying} is not in a group of {len(codes)}")
    else:
        if codes[dying] != planned:
            reasons.append(f"source rank {dying}: exit code {codes[dying]}, expected {planned}")
        for r, c in enumerate(codes):
            if r == dying or c == plan.SURVIVOR_EXIT_CODE:
                continue
            if c == 0:
                # DCP's save is collective: a peer that finished it cleanly never noticed.
                reasons.append(
                    f"source rank {r}: exited 0 although a peer died in the middle of the save"
                )
            else:
                reasons.append(
                    f"source rank {r}: exit code {c}; a rank whose save fails under it exits "
                    f"{plan.SURVIVOR_EXIT_CODE}"
                )
    reasons += rank_set(source["ranks"], scenario.source_world_size, "source")
    # Each rank reports after each save: the baseline, never the save cut short.
    reasons += [
        f"source rank {r['rank']}: recorded {len(r['saves'])} saves"
        f"{' and a reference step' if r['next'] is not None else ''}; only the baseline finishes"
        for r in source["ranks"]
        if len(r["saves"]) != 1 or r["next"] is not None
    ]
    reasons += consensus([r["saves"][0] for r in source["ranks"] if r["saves"]], "baseline")
    reasons += refused_after_baseline(obs, "candidate")
    if obs["baseline"] is not None:
        reasons += exactly_dcp_files(obs["baseline"], scenario.source_world_size, "baseline")
    candidate = obs["candidate"]
    if candidate is not None:
        if candidate["sealed"] or candidate["seal_error"] is None:
            reasons.append("candidate: a crashed writer's candidate was sealed")
        if any(f["path"] == dcp_layout.METADATA_FILE for f in candidate["files"]):
            reasons.append(
                f"candidate: the crashed save left a {dcp_layout.METADATA_FILE} commit marker"
            )
        else:
            # Every rank wrote its shard before the collective that failed: one died right after
            # writing, the other's write is local and finishes first.
            reasons += exactly_dcp_files(
                candidate, scenario.source_world_size, "candidate", metadata=False
            )
    return reasons


commits = baseline_and_candidate
sightings = source_sightings
