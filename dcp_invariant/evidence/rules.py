"""Verdicts, derived from observations alone.

This is the only code that decides pass or fail: the runner writes what these functions
derive and the verifier derives them again. Each function returns the reasons a scenario
fails; no reasons means it passes. Observations reaching here have a valid shape
(:mod:`dcp_invariant.evidence.observation`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dcp_invariant import plan, runtimes
from dcp_invariant.evidence import diagnosis, schema

Obs = dict[str, Any]


def derive(name: str, obs: Obs, *, run_plan: plan.Plan) -> list[str]:
    scenario = run_plan.scenario(name)
    reasons = [f"error: {e}" for e in obs["errors"]]
    if scenario.family == "reshard" and obs["left_out"] != list(run_plan.rank_local):
        reasons.append(
            f"plan: the reshard left out {obs['left_out']}, the plan's rank-local components "
            f"are {list(run_plan.rank_local)}"
        )
    reasons += FAMILY_RULES[scenario.family](scenario, obs)
    for key in ("commit", "baseline", "candidate"):
        if obs.get(key) is not None:
            reasons += _sealing(obs[key], key)
    return reasons


def _sealing(commit: Obs, where: str) -> list[str]:
    """A seal either succeeded, with a receipt and no error, or failed, with an error and no
    receipt: the driver records exactly one of the two (``commit`` in
    dcp_invariant/suite/scenarios/common.py)."""
    has_receipt, has_error = commit["receipt"] is not None, commit["seal_error"] is not None
    if commit["sealed"] and (not has_receipt or has_error):
        return [f"{where}: sealed, yet {'with a seal error' if has_error else 'without a receipt'}"]
    if not commit["sealed"] and (has_receipt or not has_error):
        return [
            f"{where}: not sealed, yet {'with a receipt' if has_receipt else 'without a seal error'}"
        ]
    return []


def result_record(
    name: str, obs: Obs, *, run_plan: plan.Plan, extra: Sequence[str] = ()
) -> dict[str, Any]:
    reasons = [*derive(name, obs, run_plan=run_plan), *extra]
    result = {
        "reasons": reasons,
        "scenario": name,
        "schema_version": schema.version_for(run_plan),
        "verdict": "fail" if reasons else "pass",
    }
    if run_plan.kind == "fixture":
        result["warnings"] = warnings(obs["left_running"])
        # What this scenario did not check, as the plan declared: rank-local components.
        result["left_out"] = obs.get("left_out", [])
    return result


def warnings(left_running: Sequence[Mapping[str, Any]]) -> list[str]:
    """A loop that leaves a child running does not fail (the runner killed it when its group
    ended), but the user should know: one line per group, naming the programs."""
    return [
        f"{entry['group']}: left {', '.join(entry['programs'])} running; killed when it ended"
        for entry in left_running
    ]


def results(observations: Mapping[str, Obs], *, run_plan: plan.Plan) -> dict[str, dict[str, Any]]:
    """The result record of each observation given, in plan order, judged alone and against
    its siblings (:func:`consistency`)."""
    across = consistency(observations, run_plan=run_plan)
    return {
        name: result_record(name, observations[name], run_plan=run_plan, extra=across.get(name, ()))
        for name in run_plan.names
        if name in observations
    }


def summary_record(results: dict[str, dict[str, Any]], *, run_plan: plan.Plan) -> dict[str, Any]:
    verdicts = [{"scenario": n, "verdict": results[n]["verdict"]} for n in run_plan.names]
    failed = sum(v["verdict"] == "fail" for v in verdicts)
    return {
        "failed": failed,
        "passed": len(verdicts) - failed,
        "scenarios": verdicts,
        "schema_version": schema.version_for(run_plan),
        "total": len(verdicts),
        "verdict": "fail" if failed else "pass",
    }


# --- families -------------------------------------------------------------------------------


def _training(scenario: plan.Scenario, obs: Obs) -> list[str]:
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


def _dtensor(scenario: plan.Scenario, obs: Obs) -> list[str]:
    rows, *rest = obs["global_shape"] or [0]
    reasons = []
    tested = (obs["global_shape"], obs["placement"], obs["dtype"])
    planned = (list(plan.DTENSOR.shape), plan.DTENSOR.placement, plan.DTENSOR.dtype)
    if tested != planned:
        reasons.append(f"plan: tested {tested}, the scenario is defined as {planned}")
    reasons += _group(obs["source"], scenario.source_world_size, "source")
    source_ranks = obs["source"]["ranks"]
    reasons += _consensus(
        [r["global_digest"] for r in source_ranks], "source: global tensor digest"
    )
    for rank in source_ranks:
        reasons += _shard_shape(rank, rows, rest, scenario.source_world_size, "source")
    saved = source_ranks[0]["global_digest"] if source_ranks else None
    commit = obs["commit"]
    if commit is None:
        return [*reasons, "commit: did not run"]
    reasons += _committed(commit, scenario.source_world_size)
    target = obs["target"]
    if target is None:
        return [*reasons, "target: did not run"]
    reasons += _group(target, scenario.target_world_size, "target")
    for rank in target["ranks"]:
        where = f"target rank {rank['rank']}"
        reasons += _loaded_through_pointer(rank, commit, where)
        if rank["local_shape"] is None:
            reasons.append(f"{where}: reported no local shard")
        else:
            reasons += _shard_shape(rank, rows, rest, scenario.target_world_size, "target")
        if rank["global_digest"] != saved:
            reasons.append(f"{where}: reconstructed global tensor differs from the saved one")
    return reasons


def _elastic(scenario: plan.Scenario, obs: Obs) -> list[str]:
    reasons, saved, reference = _training_source(obs, scenario.source_world_size)
    commit = obs["commit"]
    if commit is None:
        return [*reasons, "commit: did not run"]
    reasons += _committed(commit, scenario.source_world_size)
    launcher = obs["launcher"]
    if launcher is None:
        return [*reasons, "torchrun: did not run"]
    arguments = launcher["arguments"]
    if arguments != list(plan.TORCHRUN_ARGUMENTS):
        reasons.append(
            f"torchrun: launched with {' '.join(arguments)}, "
            f"not {' '.join(plan.TORCHRUN_ARGUMENTS)}"
        )
    if launcher["timed_out"]:
        reasons.append(timed_out("torchrun (the restarted job)"))
    elif launcher["exit_code"] != 0:
        reasons.append(f"torchrun: exited with code {launcher['exit_code']} after the restart")
    reasons += _guard(launcher["guard"])
    marker = obs["failure_marker"]
    expected_marker = {"attempt": 0, "exit_code": plan.ELASTIC_EXIT_CODE, "rank": plan.DYING_RANK}
    if marker != expected_marker:
        reasons.append(f"failure marker: expected {expected_marker}, got {marker}")
    target = obs["target"]
    ranks = target["ranks"] if target is not None else []
    reasons += _rank_set(ranks, scenario.target_world_size, "restarted group")
    for rank in ranks:
        where = f"restarted rank {rank['rank']}"
        if rank["restart_count"] != 1:
            reasons.append(f"{where}: TORCHELASTIC_RESTART_COUNT is {rank['restart_count']}, not 1")
        if rank["max_restarts"] != 1:
            reasons.append(f"{where}: TORCHELASTIC_MAX_RESTARTS is {rank['max_restarts']}, not 1")
        if not rank["master_addr_loopback"]:
            reasons.append(f"{where}: the rendezvous address was not numeric loopback")
        # Each restarted rank resumes its own state: per-rank state need not be replicated.
        r = rank["rank"]
        reasons += _resumed(rank, commit, saved.get(r), reference.get(r), where)
    after = obs["after"]
    if after is None:
        return [*reasons, "post-restart check: did not run"]
    if after["pointer"] != commit["pointer_after"]:
        reasons.append("post-restart: the pointer changed during the elastic restart")
    if after["receipt"] != commit["receipt"]:
        reasons.append("post-restart: the generation's receipt digest changed")
    if after["generations"] != commit["generations_after"]:
        reasons.append("post-restart: a generation was promoted after the failure")
    return reasons


def _rank_exit(scenario: plan.Scenario, obs: Obs) -> list[str]:
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
    reasons += _rank_set(source["ranks"], scenario.source_world_size, "source")
    # Each rank reports after each save: the baseline, never the save cut short.
    reasons += [
        f"source rank {r['rank']}: recorded {len(r['saves'])} saves"
        f"{' and a reference step' if r['next'] is not None else ''}; only the baseline finishes"
        for r in source["ranks"]
        if len(r["saves"]) != 1 or r["next"] is not None
    ]
    reasons += _consensus([r["saves"][0] for r in source["ranks"] if r["saves"]], "baseline")
    reasons += _refused_after_baseline(obs, "candidate")
    if obs["baseline"] is not None:
        reasons += _dcp_files(obs["baseline"], scenario.source_world_size, "baseline")
    candidate = obs["candidate"]
    if candidate is not None:
        if candidate["sealed"] or candidate["seal_error"] is None:
            reasons.append("candidate: a crashed writer's candidate was sealed")
        if any(f["path"] == plan.METADATA_FILE for f in candidate["files"]):
            reasons.append(f"candidate: the crashed save left a {plan.METADATA_FILE} commit marker")
        else:
            # Every rank wrote its shard before the collective that failed: one died right after
            # writing, the other's write is local and finishes first.
            reasons += _dcp_files(
                candidate, scenario.source_world_size, "candidate", metadata=False
            )
    return reasons


def _damaged(scenario: plan.Scenario, obs: Obs) -> list[str]:
    reasons = _group(obs["source"], scenario.source_world_size, "source")
    assert scenario.damage is not None, scenario.name
    kind, suffix, reason = (
        scenario.damage.kind,
        scenario.damage.target_suffix,
        scenario.damage.refusal,
    )
    damage = obs["damage"]
    if damage["kind"] != kind:
        reasons.append(f"damage: expected a {kind}, recorded a {damage['kind']}")
    if not damage["path"].endswith(suffix):
        reasons.append(f"damage: hit {damage['path']!r}, the scenario damages a {suffix} file")
    if (damage["offset"] is None) != (kind == "remove"):
        reasons.append("damage: a flip needs the offset it flipped, a removal has none")
    source = obs["source"]
    # Each rank reports after each of its two saves; no reference step is taken.
    reasons += [
        f"source rank {r['rank']}: recorded {len(r['saves'])} saves"
        f"{' and a reference step' if r['next'] is not None else ''}; the scenario makes 2, no step"
        for r in source["ranks"]
        if len(r["saves"]) != 2 or r["next"] is not None
    ]
    reasons += _consensus([r["saves"] for r in source["ranks"]], "source: saved states")
    reasons += _refused_after_baseline(obs, "candidate")
    if obs["baseline"] is not None:
        reasons += _dcp_files(obs["baseline"], scenario.source_world_size, "baseline")
    candidate = obs["candidate"]
    if candidate is None:
        return reasons
    if not candidate["sealed"]:
        reasons.append("candidate: was never sealed, so the damage tested nothing")
    else:
        # The receipt lists the files as sealed, before the damage.
        reasons += _dcp_files(candidate, scenario.source_world_size, "candidate")
    if candidate["receipt"] is not None and candidate["receipt"] == (obs["baseline"] or {}).get(
        "receipt"
    ):
        reasons.append("candidate: has the same receipt as the baseline")
    sizes = {f["path"]: f["size"] for f in candidate["files"]}
    if damage["path"] not in sizes:
        reasons.append(f"damage: {damage['path']} was not in the sealed receipt")
    else:
        reasons += _damage_target(damage, kind, suffix, candidate["files"])
    wanted = {"path": damage["path"], "reason": reason}
    if wanted not in candidate["refused"]:
        reasons.append(f"candidate: promotion did not report {damage['path']}: {reason}")
    elif candidate["refused"] != [wanted]:
        # Only one file was damaged, so the receipt check has exactly one failure to report.
        reasons.append(
            f"candidate: promotion reported {_refusals(candidate)}, not only {damage['path']}"
        )
    return reasons


def _damage_target(damage: Obs, kind: str, suffix: str, files: list[Obs]) -> list[str]:
    """The driver damages the last non-empty file of the sealed candidate whose name ends with
    the plan's suffix, and flips the byte at half its size (``damage`` in
    dcp_invariant/suite/scenarios/damaged.py)."""
    eligible = sorted(f["path"] for f in files if f["path"].endswith(suffix) and f["size"] > 0)
    reasons = []
    if eligible and damage["path"] != eligible[-1]:
        reasons.append(
            f"damage: hit {damage['path']}, the scenario damages the last {suffix} file, "
            f"{eligible[-1]}"
        )
    size = next(f["size"] for f in files if f["path"] == damage["path"])
    if kind == "flip" and damage["offset"] is not None and damage["offset"] != size // 2:
        reasons.append(
            f"damage: flipped the byte at {damage['offset']} of {damage['path']}, the scenario "
            f"flips the middle one, at {size // 2} of its {size} bytes"
        )
    return reasons


def _fixture_arm(
    group: Obs, world_size: int, steps_before: int, steps_after: int, where: str
) -> list[str]:
    """An arm that trained N steps, saved, and took K more, complete on every rank."""
    diverged = []
    for rank in group["ranks"]:
        found = _non_finite_loss(rank, steps_before)
        if found is not None:
            diverged.append(diagnosis.non_finite_loss(f"{where} rank {rank['rank']}", *found))
    reasons = diverged + _group(group, world_size, where)
    for rank in group["ranks"]:
        if _stopped_at_non_finite_loss(rank):
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


def _non_finite_loss(rank: Obs, steps_before: int) -> tuple[int, str] | None:
    """The first step whose recorded loss is NaN or infinite, and that loss, if any.

    A rank records such a loss and stops (dcp_invariant/suite/scenarios/fixture_tasks.py): the
    steps before the save are numbered from 1, those after it from N+1.
    """
    losses = list(enumerate(rank.get("losses_before", []), start=1))
    losses += [(steps_before + i, s["loss"]) for i, s in enumerate(rank["steps"], start=1)]
    for step, loss in losses:
        if loss in _NON_FINITE:
            return step, loss
    return None


# float.hex() of the values that are not finite; the shape check admits no other spelling.
_NON_FINITE = ("nan", "inf", "-inf")


def _stopped_at_non_finite_loss(rank: Obs) -> bool:
    if not isinstance(rank.get("steps"), list):
        return False  # a registered scenario's record: it has no per-step losses
    return _non_finite_loss(rank, 0) is not None


def _saved_by_rank(group: Obs) -> dict[int, dict[str, str]]:
    return {r["rank"]: r["saved"] for r in group["ranks"] if r["saved"] is not None}


def _resume(scenario: plan.Scenario, obs: Obs) -> list[str]:
    n, k, w = obs["steps_before_save"], obs["steps_after"], scenario.source_world_size
    reasons: list[str] = []
    for arm in ("reference", "repeat"):
        if obs[arm] is None:
            return [*reasons, f"{arm}: did not run"]
        reasons += _fixture_arm(obs[arm], w, n, k, f"uninterrupted run ({arm})")
    if reasons:
        return reasons
    reference = {r["rank"]: r for r in obs["reference"]["ranks"]}
    for rank in obs["repeat"]["ranks"]:
        reasons += diagnosis.nondeterminism(f"rank {rank['rank']}", reference[rank["rank"]], rank)
    if reasons:
        return reasons  # nothing else can be judged on a fixture that does not repeat itself
    commit = obs["commit"]
    if commit is None:
        return ["commit: did not run"]
    reasons += _committed(commit, scenario.source_world_size)
    target = obs["target"]
    if target is None:
        return [*reasons, "target: did not run"]
    reasons += _group(target, scenario.target_world_size, "resumed group")
    saved = _saved_by_rank(obs["reference"])
    cause_1: list[str] = []
    hints: list[str] = []
    loaded_ranks = []
    for rank in target["ranks"]:
        where = f"rank {rank['rank']}"
        reasons += _loaded_through_pointer(rank, commit, f"resumed {where}")
        if rank["load_error"] is not None:
            continue
        if rank["loaded"] is None:
            reasons.append(f"resumed {where}: did not load")
            continue
        loaded_ranks.append(rank)
        mine = saved.get(rank["rank"], {})
        others = {r: s for r, s in saved.items() if r != rank["rank"]}
        cause_1 += diagnosis.round_trip(where, mine, rank["loaded"], others, rank["diffs"])
        hints += [h for h in diagnosis.round_trip_hints(mine, rank["loaded"]) if h not in hints]
    cause_1 += _load_failures(target["ranks"], w, w, lambda r: f"resumed rank {r}")
    # Ranks step together: one rank's bad load moves every rank's next step.
    cause_2: list[str] = []
    for rank in loaded_ranks:
        if rank["rank"] not in reference:
            continue  # already reported: the resumed group's ranks are not the planned ones
        cause_2 += diagnosis.step_divergence(
            f"rank {rank['rank']}",
            reference[rank["rank"]]["steps"],
            rank["steps"],
            rank["diffs"],
            n,
            not cause_1,
        )
    return reasons + cause_1 + hints + cause_2


def _async_resume(scenario: plan.Scenario, obs: Obs) -> list[str]:
    """A resume whose save was async: the write overlapped step N+1 and still holds step N."""
    n, mode = obs["steps_before_save"], obs["save_mode"]
    reasons = []
    if mode != scenario.async_mode:
        reasons.append(f"plan: saved in {mode} mode, the scenario saves in {scenario.async_mode}")
    for arm in ("reference", "repeat"):
        for rank in (obs[arm] or {"ranks": []})["ranks"]:
            facts, where = rank["async"], f"async save ({arm}) rank {rank['rank']}"
            if facts["upload_error"] is not None:
                reasons.append(f"{where}: the background write failed: {facts['upload_error']}")
            if not facts["pending_during_step"]:
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
        saved = _saved_by_rank(obs["reference"])
        for rank in obs["target"]["ranks"]:
            if rank["loaded"] is not None:
                during += diagnosis.changed_during_save(
                    f"rank {rank['rank']}",
                    saved.get(rank["rank"], {}),
                    after_save.get(rank["rank"], {}),
                    rank["loaded"],
                    n,
                )
    return reasons + during + _resume(scenario, obs)


def _reshard(scenario: plan.Scenario, obs: Obs) -> list[str]:
    """Saved at a, loaded at b: every saved key loaded by some rank, each equal to what its
    source rank saved. Components declared rank-local (``left_out``, held to the plan by
    :func:`derive`) are neither loaded nor compared: each target rank keeps its own."""
    n, a, b = obs["steps_before_save"], scenario.source_world_size, scenario.target_world_size
    reasons = _fixture_arm(obs["source"], a, n, 0, "source")
    if reasons:
        return reasons
    commit = obs["commit"]
    if commit is None:
        return ["commit: did not run"]
    reasons += _committed(commit, a)
    target = obs["target"]
    if target is None:
        return [*reasons, "target: did not run"]
    reasons += _group(target, b, "resharded group")
    left_out = set(obs["left_out"])
    saved = {r: _without(keys, left_out) for r, keys in _saved_by_rank(obs["source"]).items()}
    hints: list[str] = []
    for rank in target["ranks"]:
        where = f"rank {rank['rank']} at world size {b}"
        reasons += _loaded_through_pointer(rank, commit, where)
        if rank["load_error"] is not None:
            continue
        if rank["loaded"] is None:
            reasons.append(f"{where}: did not load")
            continue
        # A rank beyond the source's takes the place of rank r mod a: replicated values agree.
        source_rank = rank["rank"] % a
        expected = saved.get(source_rank, {})
        loaded = _without(rank["loaded"], left_out)
        others = {r: s for r, s in saved.items() if r != source_rank}
        reasons += diagnosis.round_trip(
            f"{where} (saved by rank {source_rank} at {a})",
            expected,
            loaded,
            others,
            rank["diffs"],
        )
        hints += [h for h in diagnosis.round_trip_hints(expected, loaded) if h not in hints]
        found = _non_finite_loss(rank, n)
        if found is not None:
            reasons.append(diagnosis.non_finite_loss(where, *found))
        elif len(rank["steps"]) != obs["steps_after"]:
            reasons.append(
                f"{where}: took {len(rank['steps'])} steps, the plan has {obs['steps_after']}"
            )
    load_failures = _load_failures(target["ranks"], a, b, lambda r: f"rank {r} at world size {b}")
    if load_failures:
        return reasons + load_failures
    # No rule here asks the ranks to agree with each other (on the loss, say): a rank's data and
    # loss may be its own. What the whole group must do is load everything that was saved.
    loaded_anywhere: set[str] = set()
    for rank in target["ranks"]:
        loaded_anywhere.update(rank["loaded"] or {})
    if len(target["ranks"]) == b and all(r["loaded"] is not None for r in target["ranks"]):
        unloaded = sorted({k for keys in saved.values() for k in keys} - loaded_anywhere)
        if unloaded:
            components = sorted({_component(k) for k in unloaded})
            reasons.append(
                f"{diagnosis.NOT_LOADED}: saved at world size {a}, loaded by no rank at {b}: "
                f"{diagnosis.named(unloaded)}; their values are dropped, as a loader keyed by "
                "rank loses its positions (torchtitan issue #811): make the state a DTensor, "
                "or, if each rank may start it afresh when the world size changes, declare it "
                + " ".join(f"--rank-local {c}" for c in components)
            )
    return reasons + hints


def _component(key: str) -> str:
    """The top-level component of a recorded key: ``app.<component>...`` (the tool saves the
    app as ``{"app": app}``)."""
    return key.split(".", 2)[1] if key.count(".") else key


def _without(keys: Mapping[str, str], components: set[str]) -> dict[str, str]:
    if not components:
        return dict(keys)
    return {k: v for k, v in keys.items() if _component(k) not in components}


def _load_failures(ranks: list[Obs], a: int, b: int, where: Callable[[int], str]) -> list[str]:
    """Each rank's own load failure; DCP fails the load on every rank when one rank's fails."""
    failed = [r for r in ranks if r["load_error"] is not None]
    reasons = [
        r for rank in failed for r in _load_failure(rank["load_error"], where(rank["rank"]), a, b)
    ]
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
    if a == b:
        cause, why = diagnosis.ROUND_TRIP, "state_dict() names it at the load, not at the save"
    else:
        cause = diagnosis.DOES_NOT_RESHARD
        why = (
            f"make it a DTensor, or declare its component rank-local (--rank-local "
            f"{_component(key or '')})"
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


FAMILY_RULES = {
    "training": _training,
    "dtensor": _dtensor,
    "elastic": _elastic,
    "rank_exit": _rank_exit,
    "damaged": _damaged,
    "resume": _resume,
    "reshard": _reshard,
    "async_resume": _async_resume,
}


# --- across scenarios -----------------------------------------------------------------------


class _Sightings:
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


def consistency(observations: Mapping[str, Obs], *, run_plan: plan.Plan) -> dict[str, list[str]]:
    """Reasons, by scenario, where one observation contradicts its siblings.

    One fixture trained the same steps at the same world size must reach bit-identical state,
    and DCP then writes files of identical sizes: every scenario that trains is a repeat of the
    others. The registered fixture is exact across world sizes too (see the README's limits),
    so there its states agree at every world size. A forged value then disagrees with the
    siblings that recorded it independently, and so does a run that is not deterministic.
    """
    seen = _Sightings()
    for name in run_plan.names:
        obs = observations.get(name)
        if obs is None:
            continue
        family = run_plan.scenario(name).family
        w = obs["source_world_size"]
        if family in ("resume", "reshard", "async_resume"):
            _fixture_sightings(seen, name, obs, w)
        else:
            _registered_sightings(seen, name, obs, family, w, run_plan)
    return seen.disagreements()


def _registered_sightings(
    seen: _Sightings, name: str, obs: Obs, family: str, w: int, run_plan: plan.Plan
) -> None:
    n = run_plan.steps_before
    if family == "dtensor":
        for group in ("source", "target"):
            for rank in (obs[group] or {"ranks": []})["ranks"]:
                where = f"{group} rank {rank['rank']}'s global tensor digest"
                seen.add("the DTensor's global digest", name, where, rank["global_digest"])
        return
    for rank in obs["source"]["ranks"]:
        where = f"source rank {rank['rank']}"
        # Only the registered fixture is replicated and exact across world sizes; a user's
        # state may be per rank, so it is compared rank by rank at one world size.
        at = "" if run_plan.kind == "registered" else f" on rank {rank['rank']} of {w}"
        if rank["saves"]:
            seen.add(f"the state after {n} steps{at}", name, f"{where}'s save", rank["saves"][0])
        if len(rank["saves"]) > 1:  # the damage scenarios' candidate, one step later
            seen.add(
                f"the state after {n + 1} steps{at}",
                name,
                f"{where}'s second save",
                rank["saves"][1],
            )
        if rank["next"] is not None:
            step = rank["next"]
            seen.add(
                f"the state after {n + 1} steps{at}", name, f"{where}'s next step", step["digests"]
            )
            seen.add(f"the loss of step {n + 1}{at}", name, f"{where}'s next loss", step["loss"])
    for key in ("commit", "baseline"):
        if obs.get(key) is not None and obs[key]["sealed"]:
            files = obs[key]["files"]
            seen.add(
                f"the files of the save after {n} steps on {w} ranks", name, f"{key}.files", files
            )
    candidate = obs.get("candidate")
    if candidate is not None:
        if candidate["sealed"]:  # as sealed, before the damage
            what = f"the files of the save after {n + 1} steps on {w} ranks"
            seen.add(what, name, "candidate.files", candidate["files"])
        # What a save cut short leaves: the same shards, no .metadata.
        shards = [f for f in candidate["files"] if f["path"] != plan.METADATA_FILE]
        what = f"the shards of the save after {n + 1} steps on {w} ranks"
        seen.add(what, name, "candidate's shards", shards)


def _fixture_sightings(seen: _Sightings, name: str, obs: Obs, w: int) -> None:
    # Every arm that trained N steps and saved: an async save records the state at the save.
    arms = ("source",) if "source" in obs else ("reference", "repeat")
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
    commit, n = obs["commit"], obs["steps_before_save"]
    if commit is not None and commit["sealed"]:
        what = f"the files of the save after {n} steps on {w} ranks"
        seen.add(what, name, "commit.files", commit["files"])


# --- shared checks --------------------------------------------------------------------------


def _training_source(obs: Obs, world_size: int) -> tuple[list[str], dict[int, Any], dict[int, Any]]:
    """Reasons about the saving group, plus each rank's saved state and uninterrupted next step.

    Nothing here requires the ranks to agree: a rank's state is its own unless a rule that
    reshards says otherwise (:func:`_training`).
    """
    source = obs["source"]
    reasons = _group(source, world_size, "source")
    ranks = source["ranks"]
    for rank in ranks:
        if len(rank["saves"]) != 1 or rank["next"] is None:
            reasons.append(f"source rank {rank['rank']}: did not save once and step as planned")
    complete = [r for r in ranks if len(r["saves"]) == 1 and r["next"] is not None]
    saved = {r["rank"]: r["saves"][-1] for r in complete}
    reference = {r["rank"]: r["next"] for r in complete}
    return reasons, saved, reference


def _group(group: Obs, world_size: int, where: str) -> list[str]:
    reasons = []
    if group["timed_out"]:
        reasons.append(timed_out(where))
    codes = group["exit_codes"]
    if len(codes) != world_size:
        reasons.append(f"{where}: {len(codes)} exit codes for {world_size} ranks")
    # A fixture rank that recorded a non-finite loss stops there with exit code 1; the loss,
    # not the code, is the reason (reported by the family's rule).
    stopped = {
        r["rank"] for r in group["ranks"] if isinstance(r, dict) and _stopped_at_non_finite_loss(r)
    }
    reasons += [
        f"{where} rank {r}: exited with code {c}"
        for r, c in enumerate(codes)
        if c != 0 and not (c == 1 and r in stopped)
    ]
    return reasons + _rank_set(group["ranks"], world_size, where)


TIMEOUT = "timeout"


def timed_out(phase: str) -> str:
    """A group that outran ``--timeout``: the phase, and what to do if the loop is that slow."""
    return (
        f"{TIMEOUT}: {phase}: timed out and was killed; if the loop is that slow, raise "
        "--timeout SECONDS (the limit of each worker group)"
    )


def _rank_set(ranks: list[Obs], world_size: int, where: str) -> list[str]:
    got = [r["rank"] for r in ranks]
    if got != list(range(world_size)):
        return [f"{where}: reports from ranks {got}, expected {list(range(world_size))}"]
    return []


def _consensus(values: list[Any], what: str) -> list[str]:
    if any(v != values[0] for v in values[1:]):
        return [f"{what}: ranks disagree"]
    return []


def _promoted(commit: Obs, where: str) -> list[str]:
    reasons = []
    if not commit["sealed"]:
        reasons.append(f"{where}: {commit['label']} was not sealed ({commit['seal_error']})")
    if not commit["promoted"]:
        reasons.append(f"{where}: {commit['label']} was not promoted ({_refusals(commit)})")
        return reasons
    if commit["receipt"] is None or commit["refused"]:
        reasons.append(f"{where}: promoted without a clean receipt ({_refusals(commit)})")
    names = [f["path"] for f in commit["files"]]
    if plan.METADATA_FILE not in names or not any(n.endswith(plan.SHARD_SUFFIX) for n in names):
        reasons.append(
            f"{where}: the generation lacks {plan.METADATA_FILE} or a {plan.SHARD_SUFFIX} shard: {names}"
        )
    if commit["pointer_after"] is None or commit["pointer_after"] == commit["pointer_before"]:
        reasons.append(f"{where}: the pointer did not move to the new generation")
    if commit["generations_after"] != commit["generations_before"] + 1:
        reasons.append(f"{where}: promotion did not add exactly one generation")
    if commit["candidate_retained"]:
        reasons.append(f"{where}: the candidate directory was left behind after promotion")
    return reasons


def _dcp_files(commit: Obs, world_size: int, where: str, *, metadata: bool = True) -> list[str]:
    names = [f["path"] for f in commit["files"]]
    expected = plan.dcp_files(world_size, metadata=metadata)
    if names == expected:
        return []
    return [
        f"{where}: files {names}, but a DCP save by {world_size} rank(s) "
        f"{'writes' if metadata else 'cut short before its metadata leaves'} {expected}"
    ]


def _committed(commit: Obs, world_size: int) -> list[str]:
    """A save by ``world_size`` ranks, sealed and promoted with exactly DCP's files."""
    return _promoted(commit, "commit") + _dcp_files(commit, world_size, "commit")


def _refused_after_baseline(obs: Obs, key: str) -> list[str]:
    """A committed baseline, then a candidate that was not promoted and left everything as it was."""
    baseline, candidate = obs["baseline"], obs[key]
    if baseline is None:
        return ["baseline: did not run"]
    reasons = _promoted(baseline, "baseline")
    if candidate is None:
        return [*reasons, f"{key}: did not run"]
    if candidate["promoted"]:
        reasons.append(f"{key}: {candidate['label']} was promoted")
    if candidate["pointer_before"] != baseline["pointer_after"]:
        reasons.append(f"{key}: the pointer was not the baseline's before the attempt")
    if candidate["pointer_after"] != candidate["pointer_before"]:
        reasons.append(f"{key}: the pointer moved")
    if candidate["generations_after"] != candidate["generations_before"]:
        reasons.append(f"{key}: a generation was added")
    if not candidate["candidate_retained"]:
        reasons.append(f"{key}: the refused candidate was not kept for inspection")
    if obs["load_attempted"]:
        reasons.append(f"{key}: a DCP load was attempted after the refusal")
    return reasons


def _loaded_through_pointer(rank: Obs, commit: Obs, where: str) -> list[str]:
    reasons = []
    if rank["generation"] != commit["receipt"]:
        reasons.append(
            f"{where}: loaded generation {rank['generation']}, not the committed {commit['receipt']}"
        )
    if not rank["verified_before_load"]:
        reasons.append(f"{where}: receipt verification failed before load ({_refusals(rank)})")
    elif not rank["verified_after_load"]:
        reasons.append(f"{where}: receipt verification failed after load")
    return reasons


def _resumed(rank: Obs, commit: Obs, saved: Any, reference: Any, where: str) -> list[str]:
    """One resumed rank against the state its source rank saved and that rank's next step."""
    reasons = _loaded_through_pointer(rank, commit, where)
    if rank["loaded"] is None or rank["next"] is None:
        return [*reasons, f"{where}: did not load and step"]
    lost = [] if saved is None else _compare_digests(saved, rank["loaded"], f"{where}: after load")
    reasons += [f"{diagnosis.ROUND_TRIP}: {r}" for r in lost]
    if reference is None:
        return reasons
    # Loaded == saved, yet the step differs: what steers it is not saved. Otherwise the step
    # follows from the load already reported, and says nothing more about the cause.
    cause, tail = (
        (diagnosis.ROUND_TRIP, ", a consequence of the load")
        if lost
        else (diagnosis.OUTSIDE_STATE_DICT, f"; {diagnosis.SUSPECTS}")
    )
    diverged = []
    if rank["next"]["loss"] != reference["loss"]:
        diverged.append(
            f"{where}: resumed step loss {rank['next']['loss']} differs from the uninterrupted "
            f"{reference['loss']}"
        )
    diverged += _compare_digests(
        reference["digests"], rank["next"]["digests"], f"{where}: after the resumed step"
    )
    return (
        reasons
        + [f"{cause}: {r}{tail}" for r in diverged[:1]]
        + [f"{cause}: {r}" for r in diverged[1:]]
    )


def _compare_digests(expected: dict[str, str], got: dict[str, str], where: str) -> list[str]:
    reasons = [f"{where}: component {c!r} is missing" for c in sorted(set(expected) - set(got))]
    reasons += [f"{where}: unexpected component {c!r}" for c in sorted(set(got) - set(expected))]
    for component in sorted(set(expected) & set(got)):
        if component != "aggregate" and expected[component] != got[component]:
            reasons.append(f"{where}: component {component!r} differs from the uninterrupted run")
    return reasons


def _shard_shape(rank: Obs, rows: int, rest: list[int], world_size: int, where: str) -> list[str]:
    expected = [plan.expected_shard_rows(rows, world_size, rank["rank"]), *rest]
    if rank["local_shape"] != expected:
        return [
            f"{where} rank {rank['rank']}: local shard shape {rank['local_shape']}, expected {expected}"
        ]
    return []


def _guard(attestation: Obs | None) -> list[str]:
    if attestation is None:
        return [
            "torchrun guard: no attestation; the rendezvous store was not built under the guard"
        ]
    reasons = []
    runtime = runtimes.find(attestation["torch_distribution"], attestation["torch_runtime"])
    if runtime is None:
        reasons.append(
            f"torchrun guard: runtime {attestation['torch_distribution']}/{attestation['torch_runtime']} "
            "is not registered"
        )
    elif (attestation["create_tcp_store_sha256"], attestation["create_tcp_store_bytes"]) != (
        runtime.create_tcp_store_sha256,
        runtime.create_tcp_store_bytes,
    ):
        reasons.append("torchrun guard: _create_tcp_store source is not the registered one")
    if not attestation["tcp_store_pristine"]:
        reasons.append("torchrun guard: the module-local TCPStore was not pristine")
    if attestation["use_libuv"]:
        reasons.append("torchrun guard: the rendezvous store was built with libuv")
    if not attestation["shared_rendezvous_store_disabled"]:
        reasons.append("torchrun guard: TORCH_DISABLE_SHARE_RDZV_TCP_STORE was not set")
    if attestation["stores_built"] < 1:
        reasons.append("torchrun guard: no rendezvous store was built")
    elif attestation["stores_built"] > 1:
        # The agent builds its rendezvous store once and keeps it across the restart.
        reasons.append(
            f"torchrun guard: {attestation['stores_built']} rendezvous stores were built; the "
            "agent builds one and keeps it across the restart"
        )
    return reasons


def _refusals(record: Obs) -> str:
    return "; ".join(f"{f['path']}: {f['reason']}" for f in record["refused"]) or "no reason"
