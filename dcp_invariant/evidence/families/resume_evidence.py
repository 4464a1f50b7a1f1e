"""The resume family of a fixture run: fresh ranks load the save at the same world size and
match the uninterrupted run's next steps; and the run that saved matches one that never did."""

from __future__ import annotations

from dcp_invariant import plan
from dcp_invariant.evidence import diagnosis, object_causes
from dcp_invariant.evidence.checks import optional, record_omitting
from dcp_invariant.evidence.families._drawn_later import FURTHER, judged
from dcp_invariant.evidence.families._fixture_arms import (
    fixture_arm,
    fixture_common_fields,
    fixture_sightings,
    fixture_train_rank,
    load_failures,
    never_saves_rank,
    never_saving_arm,
    saved_by_rank,
)
from dcp_invariant.evidence.families._groups import ended_early, group_finished
from dcp_invariant.evidence.families._promotion import (
    commit_at_baseline,
    committed,
    loaded_through_pointer,
)
from dcp_invariant.evidence.families._record_parts import Obs, always, group

SHAPE = record_omitting(
    {"further": FURTHER},
    **fixture_common_fields,
    never_saves=optional(group(never_saves_rank)),
    reference=optional(group(fixture_train_rank)),
    repeat=optional(group(fixture_train_rank)),
)

shape_for = always(SHAPE)


def rule(scenario: plan.Scenario, obs: Obs) -> list[str]:
    n, k, w = obs["steps_before_save"], obs["steps_after"], scenario.source_world_size
    reasons: list[str] = []
    # In the order the driver runs them: the first that did not run is the one that stopped it.
    for arm, check in (
        ("reference", fixture_arm),
        ("never_saves", never_saving_arm),
        ("repeat", fixture_arm),
    ):
        if obs[arm] is None:
            return [*reasons, f"{arm}: did not run"]
        reasons += check(obs[arm], w, n, k, f"uninterrupted run ({arm})")
    if reasons:
        return reasons
    reference = {r["rank"]: r for r in obs["reference"]["ranks"]}
    never = {r["rank"]: r for r in obs["never_saves"]["ranks"]}
    for rank in obs["repeat"]["ranks"]:
        reasons += diagnosis.nondeterminism(f"rank {rank['rank']}", reference[rank["rank"]], rank)
    for r, rank in sorted(never.items()):
        if not reasons and r in reference:
            # Before the save, the arm that never saves is one more uninterrupted run.
            before = {"losses_before": rank["losses_before"], "saved": None, "steps": []}
            reasons += diagnosis.nondeterminism(
                f"rank {r}", {**reference[r], "saved": None, "steps": []}, before
            )
    if reasons:
        return reasons  # nothing else can be judged on a fixture that does not repeat itself
    save_changed = _save_changed(obs["reference"], never, n)
    commit = obs["commit"]
    if commit is None:
        return ["commit: did not run"]
    reasons += committed(commit, scenario)
    target = obs["target"]
    if target is None:
        return [*reasons, "target: did not run"]
    reasons += group_finished(target, scenario.target_world_size, "resumed group")
    saved = saved_by_rank(obs["reference"])
    cause_1: list[str] = []
    cautions: list[str] = []  # loads applied late (diagnosis.restored_late)
    lost_any = False  # a rank lost state at the load
    hints: list[str] = []
    loaded_ranks = []
    for rank in target["ranks"]:
        where = f"rank {rank['rank']}"
        reasons += loaded_through_pointer(rank, commit, f"resumed {where}")
        if rank["load_error"] is not None:
            continue
        if rank["loaded"] is None:
            reasons.append(f"resumed {where}: did not load")
            continue
        loaded_ranks.append(rank)
        mine = saved.get(rank["rank"], {})
        others = {r: s for r, s in saved.items() if r != rank["rank"]}
        lost = diagnosis.round_trip(
            where, mine, rank["loaded"], others, rank["diffs"], diagnosis.round_trip_cause(scenario)
        )
        uninterrupted = reference.get(rank["rank"])
        if (
            lost
            and uninterrupted is not None
            and diagnosis.resumed_exactly(uninterrupted["steps"], rank["steps"], k)
        ):
            if diagnosis.holds_rank_0s_copy(mine, rank["loaded"], saved.get(0)):
                continue  # a per-rank value the first step overwrote from rank 0's
            # Nothing was lost: what the load got was applied at the first step instead.
            load = "load_state_dict()" if scenario.checkpointing == "dcp" else "the app's load()"
            keys = diagnosis.named(diagnosis.differing_keys(mine, rank["loaded"]))
            cautions += diagnosis.restored_late(where, keys, load)
            continue
        cause_1 += lost
        lost_any = lost_any or bool(lost)
        if scenario.checkpointing == "dcp":  # the hints are about DCP's own ways
            hints += [
                h
                for h in diagnosis.round_trip_hints(mine, rank["loaded"], others)
                if h not in hints
            ]
    failed = load_failures(scenario, target["ranks"], lambda r: f"resumed rank {r}")
    cause_1 += failed
    # A rank restored late stepped as the uninterrupted run did: it moved no other rank's step.
    lost_any = lost_any or bool(failed)
    # Ranks step together: one rank's bad load moves every rank's next step.
    cause_2: list[str] = []
    for rank in [] if ended_early(target) else loaded_ranks:
        if rank["rank"] not in reference:
            continue  # already reported: the resumed group's ranks are not the planned ones
        arm = reference[rank["rank"]]
        where = f"rank {rank['rank']}"
        diverged = diagnosis.step_divergence(
            where,
            reference[rank["rank"]]["steps"],
            rank["steps"],
            rank["diffs"],
            n,
            not lost_any,
            diagnosis.outside_cause(scenario),
            _objects_after_load(arm, rank),
            diagnosis.round_trip_cause(scenario),
        )
        if not diverged and not cause_1:
            diverged = _unseen_at_the_end(scenario, obs, arm, rank, where)
        cause_2 += diverged
    return reasons + cause_1 + hints + save_changed + cause_2 + cautions


def _save_changed(reference: Obs, never: dict[int, Obs], n: int) -> list[str]:
    """Where the arm whose save is loaded parts from the arm that never saves (``never``, by
    rank), after the save, with what the save changed in the app's objects."""
    reasons = []
    for rank in reference["ranks"]:
        other = never.get(rank["rank"])
        if other is None:
            continue  # already reported: the arms' ranks are not the planned ones
        without, saved = object_causes.walk(other, "saved"), object_causes.walk(rank, "saved")
        named = ""
        if without is not None and saved is not None:
            paths = object_causes.changed_by_save(without, saved)
            if paths:
                named = "right after the save the app's " + object_causes.shown(
                    without, saved, paths, "without the save", "after the save"
                )
                named += " differ" + "".join(
                    f"; likely {c}" for c in object_causes.save_causes(paths)
                )
        reasons += diagnosis.save_changed_training(
            f"rank {rank['rank']}",
            other["losses_after"],
            [s["loss"] for s in rank["steps"]],
            n,
            named,
        )
    return reasons


def _objects_after_load(arm: Obs, rank: Obs) -> str:
    """The app's attributes that differ between the save and right after the load, with their
    likely causes: what a step that differs although the state dict round-tripped points at.
    (What two runs disagree on was recorded as volatile in both: object_causes.settle.)"""
    saved, loaded = object_causes.walk(arm, "saved"), object_causes.walk(rank, "loaded")
    if saved is None or loaded is None:
        return ""
    paths = object_causes.differing(saved, loaded)
    if not paths:
        return ""
    text = "the app's objects that differ right after the load: " + object_causes.shown(
        saved, loaded, paths, "saved", "loaded"
    )
    causes = object_causes.likely_causes(paths)
    return text + (f" (likely {'; '.join(causes)})" if causes else "")


def _unseen_at_the_end(
    scenario: plan.Scenario, obs: Obs, arm: Obs, rank: Obs, where: str
) -> list[str]:
    """Every resumed step matched, yet the app's tensors differ from the uninterrupted run's
    after the K steps: state that never reaches the loss (an EMA the checkpoint leaves out).
    Generators alone are judged by the arms run further (:mod:`._drawn_later`)."""
    k = obs["steps_after"]
    final, resumed = object_causes.walk(arm, "final"), object_causes.walk(rank, "final")
    if final is None or resumed is None:
        return []
    paths = object_causes.at_the_end(final, resumed)
    if not paths:
        return []
    named = object_causes.shown(final, resumed, paths, "uninterrupted", "resumed")
    causes = object_causes.likely_causes(paths) or [
        "save it with the rest of the state, or drop it if nothing reads it"
    ]
    # A tensor that depends on the run's history but is rebuilt or only measured (a cache, a
    # metric) is not a resume bug: the user says so, and it is left out.
    ignore = (
        "if it is rebuilt on demand or only measured (a cache, a metric), leave it out "
        f"with --ignore-attr {'.'.join(paths[0].split('.')[:2])}"
    )
    if object_causes.generators_alone(final, resumed, paths):
        return judged(scenario, obs, rank["rank"], where, named, "; ".join(causes), ignore)
    cause, _ = diagnosis.outside_cause(scenario)
    return [
        f"{cause}: {where}: every resumed step matches, yet after the {k} resumed steps the "
        f"app's {named} differ from the uninterrupted run's: state no loss shows (an EMA or "
        "averaged model, a copy kept aside) that the checkpoint does not carry; "
        + "; ".join(causes)
        + f"; {ignore}"
    ]


commits = commit_at_baseline
sightings = fixture_sightings
