"""The async_resume family of a fixture run: a resume whose save was ``dcp.async_save``, or the
app's own save, which returned a future."""

from __future__ import annotations

from typing import get_args

from dcp_invariant import plan
from dcp_invariant.evidence import diagnosis
from dcp_invariant.evidence.checks import one_of, optional, record_omitting
from dcp_invariant.evidence.families import resume_evidence
from dcp_invariant.evidence.families._drawn_later import FURTHER
from dcp_invariant.evidence.families._fixture_arms import (
    async_train_rank,
    fixture_common_fields,
    fixture_sightings,
    fixture_train_rank,
    never_saves_rank,
    saved_by_rank,
)
from dcp_invariant.evidence.families._promotion import commit_at_baseline
from dcp_invariant.evidence.families._record_parts import Obs, always, group

SHAPE = record_omitting(
    {"further": FURTHER},
    **fixture_common_fields,
    save_mode=one_of(*get_args(plan.AsyncMode)),
    # never_saves and repeat are null where resume_<w>'s observation holds them, and judged
    # from there (shared_arms.py); a job's scenarios, which share nothing, keep their own.
    never_saves=optional(group(never_saves_rank)),
    reference=optional(group(async_train_rank)),
    repeat=optional(group(fixture_train_rank)),
)

shape_for = always(SHAPE)


def rule(scenario: plan.Scenario, obs: Obs) -> list[str]:
    """A resume whose save was async: the write overlapped step N+1 and still holds step N."""
    n, mode = obs["steps_before_save"], obs["save_mode"]
    reasons = []
    if mode != scenario.async_mode:
        reasons.append(f"plan: saved in {mode} mode, the scenario saves in {scenario.async_mode}")
    by_app = mode == "app"
    for rank in (obs["reference"] or {"ranks": []})["ranks"]:
        facts, where = rank["async"], f"async save (reference) rank {rank['rank']}"
        if facts["upload_error"] is not None:
            whose = "the app's save() future raised" if by_app else "the background write failed"
            reasons.append(f"{where}: {whose}: {facts['upload_error']}")
        # The tool holds DCP's writer back until step N+1 is over, so that step overlaps
        # the write; an app's writer is its framework's, and whether it still ran is its
        # timing (not recorded: two runs would differ).
        if by_app and facts["pending_during_step"] is not None:
            reasons.append(f"{where}: an app's save is not held back, so no overlap is known")
        elif not by_app and facts["pending_during_step"] is not True:
            reasons.append(
                f"{where}: the write had finished before step {n + 1} ended, so nothing "
                "overlapped it"
            )
        if facts["staged_first"] != (mode == "staged"):
            reasons.append(f"{where}: staging did not follow the {mode} mode")
    during = []
    if obs["target"] is not None and obs["reference"] is not None:
        after_save = {
            r["rank"]: r["steps"][0]["keys"] for r in obs["reference"]["ranks"] if r["steps"]
        }
        saved = saved_by_rank(obs["reference"])
        for rank in obs["target"]["ranks"]:
            if rank["loaded"] is not None:
                during += diagnosis.changed_during_save(
                    f"rank {rank['rank']}",
                    saved.get(rank["rank"], {}),
                    after_save.get(rank["rank"], {}),
                    rank["loaded"],
                    n,
                    by_app,
                )
    return reasons + during + resume_evidence.rule(scenario, obs)


commits = commit_at_baseline
sightings = fixture_sightings
