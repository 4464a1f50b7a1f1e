"""The half_written family of an app that saves itself: its own load() pointed at a checkpoint
cut short must refuse it on some rank (dcp_invariant/suite/scenarios/half_written.py)."""

from __future__ import annotations

from dcp_invariant import plan
from dcp_invariant.evidence import diagnosis
from dcp_invariant.evidence.checks import boolean, integer, optional, record, string
from dcp_invariant.evidence.families._fixture_arms import (
    fixture_arm,
    fixture_common_fields,
    fixture_sightings,
    fixture_train_rank,
)
from dcp_invariant.evidence.families._groups import group_finished
from dcp_invariant.evidence.families._promotion import commit_at_baseline, committed
from dcp_invariant.evidence.families._record_parts import Obs, always, cut, group

_load_cut_rank = record(rank=integer(0), loaded=boolean, exception=optional(string))

SHAPE = record(
    **{k: v for k, v in fixture_common_fields.items() if k != "target"},
    source=optional(group(fixture_train_rank)),
    cut=optional(cut),
    cut_load=optional(group(_load_cut_rank)),
)

shape_for = always(SHAPE)


def rule(scenario: plan.Scenario, obs: Obs) -> list[str]:
    n, w = obs["steps_before_save"], scenario.source_world_size
    if obs["source"] is None:
        return ["source: did not run"]
    reasons = fixture_arm(obs["source"], w, n, obs["steps_after"], "source")
    if reasons:
        return reasons
    if obs["commit"] is None:
        return ["commit: did not run"]
    reasons += committed(obs["commit"], scenario)
    loads, shortened = obs["cut_load"], obs["cut"]
    if loads is None or shortened is None:
        return [*reasons, "cut-load: did not run"]
    reasons += group_finished(loads, scenario.target_world_size, "cut-load")
    ranks = loads["ranks"]
    if ranks and all(rank["loaded"] for rank in ranks):
        what = ", ".join(
            [
                *(f"{name} whole" for name in shortened["kept"]),
                f"{shortened['truncated']} cut to half",
                *(f"{name} missing" for name in shortened["left_out"]),
            ]
        )
        reasons.append(
            f"{diagnosis.LOADS_CUT_SHORT}: every rank's load() returned on the save after {n} "
            f"steps cut short ({what}): a job resumed after a crash mid-save would train on what "
            "it read; have load() check that every file is whole (a manifest written last, as "
            "DCP's .metadata is) or resume only from what the save marked finished"
        )
    return reasons


commits = commit_at_baseline
sightings = fixture_sightings
