"""A commit's checks: sealed and promoted with exactly DCP's files (or an app's own), or refused
leaving all as it was; and the ranks that load it do so through the pointer."""

from __future__ import annotations

from dcp_invariant import dcp_layout, plan
from dcp_invariant.evidence import diagnosis
from dcp_invariant.evidence.families._groups import group_finished
from dcp_invariant.evidence.families._record_parts import Obs
from dcp_invariant.evidence.families.records import CommitRecord, GroupRecord


def commit_at_baseline(run_plan: plan.Plan) -> list[tuple[str, str]]:
    """One commit, ``commit``, of the save after the plan's steps before the save."""
    return [("commit", run_plan.baseline_label)]


def baseline_and_candidate(run_plan: plan.Plan) -> list[tuple[str, str]]:
    """A committed baseline, then the candidate one step later that the scenario acts on."""
    return [("baseline", run_plan.baseline_label), ("candidate", run_plan.candidate_label)]


def _promoted(commit: CommitRecord, where: str, *, by_dcp: bool = True) -> list[str]:
    """Sealed and promoted cleanly; ``by_dcp``: with DCP's marker and a shard (an app that saves
    itself writes files of its own, at least one)."""
    reasons = []
    if not commit["sealed"]:
        reasons.append(f"{where}: {commit['label']} was not sealed ({commit['seal_error']})")
    if not commit["promoted"]:
        reasons.append(f"{where}: {commit['label']} was not promoted ({refusals(commit)})")
        return reasons
    if commit["receipt"] is None or commit["refused"]:
        reasons.append(f"{where}: promoted without a clean receipt ({refusals(commit)})")
    names = [f["path"] for f in commit["files"]]
    if not by_dcp:
        if not names:
            reasons.append(f"{where}: the generation holds no file")
    elif dcp_layout.METADATA_FILE not in names or not any(
        n.endswith(dcp_layout.SHARD_SUFFIX) for n in names
    ):
        reasons.append(
            f"{where}: the generation lacks {dcp_layout.METADATA_FILE} or a {dcp_layout.SHARD_SUFFIX} shard: {names}"
        )
    if commit["pointer_after"] is None or commit["pointer_after"] == commit["pointer_before"]:
        reasons.append(f"{where}: the pointer did not move to the new generation")
    if commit["generations_after"] != commit["generations_before"] + 1:
        reasons.append(f"{where}: promotion did not add exactly one generation")
    if commit["candidate_retained"]:
        reasons.append(f"{where}: the candidate directory was left behind after promotion")
    return reasons


def exactly_dcp_files(
    commit: CommitRecord, world_size: int, where: str, *, metadata: bool = True
) -> list[str]:
    """The commit's files are exactly those a DCP save by ``world_size`` ranks writes (without
    ``.metadata``: a save cut short)."""
    names = [f["path"] for f in commit["files"]]
    expected = dcp_layout.dcp_files(world_size, metadata=metadata)
    if names == expected:
        return []
    return [
        f"{where}: files {names}, but a DCP save by {world_size} rank(s) "
        f"{'writes' if metadata else 'cut short before its metadata leaves'} {expected}"
    ]


def committed(commit: CommitRecord, scenario: plan.Scenario) -> list[str]:
    """The source's save, sealed and promoted: with exactly the files a DCP save by its ranks
    writes, or, for an app that saves itself, with whatever files it wrote (the seal refuses a
    save that wrote none)."""
    if scenario.checkpointing == "app":
        if not commit["sealed"]:  # no marker to wait for: what the save wrote is not a checkpoint
            error = str(commit["seal_error"])
            late = f"{diagnosis.WRITTEN_AFTER_SAVE}: "  # its own cause (suite/scenarios/commits.py)
            if error.startswith(late):
                return [f"{late}commit: {error.removeprefix(late)}"]
            return [f"{diagnosis.UNSEALABLE}: commit: {error}"]
        return _promoted(commit, "commit", by_dcp=False)
    return _promoted(commit, "commit") + exactly_dcp_files(
        commit, scenario.source_world_size, "commit"
    )


def committed_then_loaded(
    scenario: plan.Scenario, obs: Obs
) -> tuple[list[str], CommitRecord | None, GroupRecord | None]:
    """The source's save committed, then the target group that loaded it: the reasons so far,
    and the commit and target records, each None when it did not run (nothing more to judge)."""
    commit: CommitRecord | None = obs["commit"]
    if commit is None:
        return ["commit: did not run"], None, None
    reasons = committed(commit, scenario)
    target: GroupRecord | None = obs["target"]
    if target is None:
        return [*reasons, "target: did not run"], commit, None
    return reasons + group_finished(target, scenario.target_world_size, "target"), commit, target


def refused_after_baseline(obs: Obs, key: str) -> list[str]:
    """A committed baseline, then a candidate that was not promoted and left everything as it was."""
    baseline: CommitRecord | None = obs["baseline"]
    candidate: CommitRecord | None = obs[key]
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


def loaded_through_pointer(rank: Obs, commit: CommitRecord, where: str) -> list[str]:
    """A loading rank resolved the committed generation and verified it before and after."""
    reasons = []
    if rank["generation"] != commit["receipt"]:
        reasons.append(
            f"{where}: loaded generation {rank['generation']}, not the committed {commit['receipt']}"
        )
    if not rank["verified_before_load"]:
        reasons.append(f"{where}: receipt verification failed before load ({refusals(rank)})")
    elif not rank["verified_after_load"]:
        reasons.append(f"{where}: receipt verification failed after load")
    return reasons


def refusals(record: CommitRecord | Obs) -> str:
    """What a commit or a loading rank recorded as refused, for a reason's text."""
    return "; ".join(f"{f['path']}: {f['reason']}" for f in record["refused"]) or "no reason"
