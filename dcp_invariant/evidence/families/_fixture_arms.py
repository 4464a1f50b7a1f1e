"""A fixture run's arms, which the resume, reshard and async_resume families share: the shape of
an arm that trained N steps, saved and took K more, its checks, why a load failed, and what the
arms add to the sightings across scenarios."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from dcp_invariant import plan
from dcp_invariant.evidence import diagnosis
from dcp_invariant.evidence.checks import (
    Check,
    boolean,
    integer,
    list_of,
    one_of,
    optional,
    record,
    string,
    type_name,
)
from dcp_invariant.evidence.families._groups import (
    NON_FINITE,
    ended_early,
    first_non_finite_loss,
    group_finished,
    stopped_at_non_finite_loss,
)
from dcp_invariant.evidence.families._promotion import committed
from dcp_invariant.evidence.families._record_parts import (
    Obs,
    commit,
    common_fields,
    float_hex,
    group,
    load_fields,
)
from dcp_invariant.evidence.families._sightings import Sightings
from dcp_invariant.evidence.families.records import GroupRecord

# A fixture run's per-key records: {"app.model.weight": "float32[4,2] <sha256>", ...}.
_KEY_PATH = re.compile(r"[^\x00-\x1f]{1,1024}")

_MAX_KEYS = 20_000


def key_records(value: Any, where: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where}: expected an object of per-key records, got {type_name(value)}"]
    if len(value) > _MAX_KEYS:
        return [f"{where}: more than {_MAX_KEYS} keys"]
    problems = []
    for key, entry in value.items():
        if not _KEY_PATH.fullmatch(key):
            problems.append(f"{where}: invalid key path {key!r}")
        elif not isinstance(entry, str) or not diagnosis.KEY_ENTRY.fullmatch(entry):
            problems.append(f"{where}.{key}: expected '<type> <64-hex digest>', got {entry!r}")
    return problems


# The app's own objects (dcp_invariant/ranks/app_objects.py): a fingerprint by attribute path,
# a number's own value or a kind and digest, printable and short.
_OBJECT_ENTRY = re.compile(r"[\x20-\x7e]{1,200}")
_MAX_OBJECTS = 20_000 + 16  # the walk's attributes, and the global RNGs


def object_records(value: Any, where: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where}: expected an object of fingerprints, got {type_name(value)}"]
    if len(value) > _MAX_OBJECTS:
        return [f"{where}: more than {_MAX_OBJECTS} attributes"]
    problems = []
    for path, entry in value.items():
        if not _KEY_PATH.fullmatch(path):
            problems.append(f"{where}: invalid attribute path {path!r}")
        elif not isinstance(entry, str) or not _OBJECT_ENTRY.fullmatch(entry):
            problems.append(
                f"{where}.{path}: expected a short printable fingerprint, got {entry!r}"
            )
    return problems


def _objects_at(*phases: str) -> Check:
    return record(**{phase: optional(object_records) for phase in phases})


_steps = list_of(record(keys=key_records, loss=float_hex), plan.MAX_STEPS)

# What a rank of an arm that trained N steps, saved and took K more reports.
_train_fields: dict[str, Check] = {
    "rank": integer(0),
    "losses_before": list_of(float_hex, plan.MAX_STEPS),
    "saved": optional(key_records),
    "steps": _steps,
    "objects": _objects_at("saved", "final"),
}

fixture_train_rank = record(**_train_fields)

# What a rank of the arm that never saves reports (fixture_never_saves): losses and its walks.
never_saves_rank = record(
    rank=integer(0),
    losses_before=list_of(float_hex, plan.MAX_STEPS),
    losses_after=list_of(float_hex, plan.MAX_STEPS),
    objects=_objects_at("saved", "final"),
)

fixture_resume_rank = record(
    **load_fields,
    loaded=optional(key_records),
    objects=_objects_at("loaded", "final"),
    load_error=optional(
        record(kind=one_of(*plan.LOAD_FAILURES), key=optional(string), exception=optional(string))
    ),
    steps=_steps,
    diffs=list_of(
        record(key=string, max_abs_diff=optional(float_hex), phase=string),
        32 * (plan.MAX_STEPS + 1),
    ),
)

# An async save's own facts: the next step overlapped the write, and the write's outcome.
async_train_rank = record(
    **_train_fields,
    **{
        "async": record(
            # None for the app's own save (async_resume_evidence.rule says why).
            pending_during_step=optional(boolean),
            staged_first=boolean,
            upload_error=optional(string),
        )
    },
)


def left_running(value: Any, where: str) -> list[str]:
    """What a fixture run's groups left running: ``[{"group": ..., "programs": [...]}]``, one
    entry per group in name order, each program list sorted (the runner kills them all)."""
    problems = list_of(record(group=string, programs=list_of(string, 64)), 64)(value, where)
    if problems:
        return problems
    groups = [entry["group"] for entry in value]
    if groups != sorted(set(groups)):
        problems.append(f"{where}: expected one entry per group, in name order")
    for i, entry in enumerate(value):
        if not entry["programs"] or entry["programs"] != sorted(entry["programs"]):
            problems.append(f"{where}[{i}].programs: expected a non-empty sorted list")
    return problems


fixture_common_fields: dict[str, Check] = {
    **common_fields,
    "left_running": left_running,
    "fixture": string,
    "steps_before_save": integer(1),
    "steps_after": integer(1),
    "commit": optional(commit),
    "target": optional(group(fixture_resume_rank)),
}


def fixture_arm(
    group: GroupRecord, world_size: int, steps_before: int, steps_after: int, where: str
) -> list[str]:
    """An arm that trained N steps, saved, and took K more, complete on every rank."""
    diverged = []
    for rank in group["ranks"]:
        found = first_non_finite_loss(rank, steps_before)
        if found is not None:
            diverged.append(diagnosis.non_finite_loss(f"{where} rank {rank['rank']}", *found))
    reasons = diverged + group_finished(group, world_size, where)
    if ended_early(group):
        return reasons  # its ranks stopped where the first reason says
    for rank in group["ranks"]:
        if stopped_at_non_finite_loss(rank):
            continue  # it stopped there, as it must: already the first reason
        if (
            len(rank["losses_before"]) != steps_before
            or rank["saved"] is None
            or len(rank["steps"]) != steps_after
        ):
            reasons.append(
                f"{where} rank {rank['rank']}: did not take {steps_before} steps, save, "
                f"and take {steps_after} more"
            )
    return reasons


def source_committed(scenario: plan.Scenario, obs: Obs) -> tuple[list[str], bool]:
    """A scenario whose source arm saved and committed (a reshard's, a cross-release one's):
    the reasons so far, and whether the loading groups can be judged after them."""
    n, a = obs["steps_before_save"], scenario.source_world_size
    reasons = fixture_arm(obs["source"], a, n, obs["steps_after"], "source")
    if reasons:
        return reasons, False
    if obs["commit"] is None:
        return ["commit: did not run"], False
    return committed(obs["commit"], scenario), True


def never_saving_arm(
    group: GroupRecord, world_size: int, steps_before: int, steps_after: int, where: str
) -> list[str]:
    """The arm that never saves, which took N+K steps on every rank (a rank stops at a NaN or
    infinite loss, as the saving arms do: the first reason then)."""
    diverged, reasons = [], group_finished(group, world_size, where)
    if ended_early(group):
        return reasons
    for rank in group["ranks"]:
        losses = enumerate(rank["losses_before"] + rank["losses_after"], start=1)
        found = next(((step, loss) for step, loss in losses if loss in NON_FINITE), None)
        if found is not None:
            diverged.append(diagnosis.non_finite_loss(f"{where} rank {rank['rank']}", *found))
        elif (len(rank["losses_before"]), len(rank["losses_after"])) != (steps_before, steps_after):
            reasons.append(
                f"{where} rank {rank['rank']}: did not take {steps_before} + {steps_after} steps"
            )
    return diverged + reasons


def saved_by_rank(group: GroupRecord) -> dict[int, dict[str, str]]:
    """Each rank's per-key records of the state it saved, for the ranks that saved."""
    return {r["rank"]: r["saved"] for r in group["ranks"] if r["saved"] is not None}


def component(key: str) -> str:
    """The top-level component of a recorded key: ``app.<component>...`` (the tool records the
    app's state as it saves it through DCP, as ``{"app": app}``)."""
    return key.split(".", 2)[1] if key.count(".") else key


def load_failures(
    scenario: plan.Scenario, ranks: list[Obs], where: Callable[[int], str]
) -> list[str]:
    """Each rank's own load failure (DCP fails its load on every rank when one rank's fails),
    or the app's own load()'s exception."""
    a, b = scenario.source_world_size, scenario.target_world_size
    by_app = scenario.checkpointing == "app"
    failed = [r for r in ranks if r["load_error"] is not None]
    reasons = []
    for rank in failed:
        error = rank["load_error"]
        if (error["kind"] == "app load") != by_app:
            # Who loaded is the plan's: the tool through DCP, or the app's own load(), never both.
            whose = "the app's own load()" if by_app else "DCP's load"
            reasons.append(
                f"{where(rank['rank'])}: a load error of kind {error['kind']!r}, which "
                f"{whose} cannot give: the record is not this plan's"
            )
            continue
        reasons += _load_failure(error, where(rank["rank"]), a, b)
    if failed and not reasons:
        cause = diagnosis.DOES_NOT_RESHARD if a != b else diagnosis.ROUND_TRIP
        ranks_named = ", ".join(str(r["rank"]) for r in failed)
        reasons.append(f"{cause}: the load failed on ranks {ranks_named}, each blaming another")
    return reasons


def _load_failure(error: Obs, where: str, a: int, b: int) -> list[str]:
    """Why DCP's load failed on a rank, as a cause; resharding or not (``a == b``)."""
    kind, key = error["kind"], error["key"]
    if kind == "another rank":
        return []  # the rank whose own load failed says why
    if kind == "app load" and a != b:
        return [
            f"{diagnosis.DOES_NOT_RESHARD}: {where}: the app's own load() raised "
            f"{error['exception']} on the checkpoint its save() wrote at world size {a}, though "
            "the app declares reshards = True: make its load() take a save from another world "
            "size, or drop the declaration; its traceback is in the worker's log"
        ]
    if kind == "app load":
        return [
            f"{diagnosis.APP_ROUND_TRIP}: {where}: the app's own load() raised {error['exception']} "
            "on the checkpoint its save() wrote; its traceback is in the worker's log"
        ]
    if kind == "unreadable metadata":  # the same torch that wrote it: the file is damaged
        said = error["exception"] or "its error names a file"
        return [
            f"{diagnosis.ROUND_TRIP}: {where}: DCP could not read the checkpoint's .metadata "
            f"({said}); its traceback is in the worker's log"
        ]
    if a == b:
        cause, why = diagnosis.ROUND_TRIP, "state_dict() names it at the load, not at the save"
    else:
        cause = diagnosis.DOES_NOT_RESHARD
        why = (
            f"make it a DTensor, or declare its component rank-local (--rank-local "
            f"{component(key or '')})"
        )
    if kind == "missing key":
        reshard = ": state keyed by rank does not reshard (torchtitan issue #811)" if a != b else ""
        return [
            f"{cause}: {where}: the checkpoint saved at world size {a} has no {key}{reshard}; {why}"
        ]
    if kind == "size mismatch":
        return [
            f"{cause}: {where}: {key} was saved with another size than it has here: a tensor "
            f"that differs by rank and is not a DTensor does not reshard; {why}"
        ]
    return [
        f"{cause}: {where}: DCP's load raised {error['exception']}; its traceback is in the "
        "worker's log"
    ]


def fixture_sightings(seen: Sightings, name: str, obs: Obs, run_plan: plan.Plan) -> None:
    w = obs["source_world_size"]
    # Every arm that trained N steps and saved: an async save records the state at the save.
    arms = ("source",) if "source" in obs else ("reference", "repeat")
    for rank in (obs.get("never_saves") or {"ranks": []})["ranks"]:
        seen.add(
            f"the losses before the save on rank {rank['rank']} of {w}",
            name,
            f"never_saves rank {rank['rank']}'s losses",
            rank["losses_before"],
        )
    for arm in arms:
        if obs.get(arm) is None:
            continue
        for rank in obs[arm]["ranks"]:
            r, where = rank["rank"], f"{arm} rank {rank['rank']}"
            at = f"rank {r} of {w}"
            seen.add(
                f"the losses before the save on {at}",
                name,
                f"{where}'s losses",
                rank["losses_before"],
            )
            seen.add(f"the state saved on {at}", name, f"{where}'s saved keys", rank["saved"])
            # The K steps after a save, whatever its mode: a save must not change them.
            seen.add(f"the steps after the save on {at}", name, f"{where}'s steps", rank["steps"])
    commit, n = obs["commit"], obs["steps_before_save"]
    if commit is not None and commit["sealed"]:
        what = f"the files of the save after {n} steps on {w} ranks"
        seen.add(what, name, "commit.files", commit["files"])
