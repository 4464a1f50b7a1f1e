"""Verdicts, derived from observations alone.

This is the only code that decides pass or fail: the runner writes what these functions
derive and the verifier derives them again. Each function returns the reasons a scenario
fails; no reasons means it passes. Observations reaching here have a valid shape
(:mod:`dcp_invariant.evidence.observation`). Each family's own rule is in its module of
:mod:`dcp_invariant.evidence.families`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from dcp_invariant import plan
from dcp_invariant.evidence import object_causes, schema, shared_arms
from dcp_invariant.evidence.diagnosis import Caution
from dcp_invariant.evidence.families import FAMILIES
from dcp_invariant.evidence.families._record_parts import Obs
from dcp_invariant.evidence.families._sightings import Sightings
from dcp_invariant.evidence.families.records import CommitRecord


def derive(name: str, obs: Obs, *, run_plan: plan.Plan) -> list[str]:
    """The reasons ``obs`` fails; none when it passes."""
    return judge(name, obs, run_plan=run_plan)[0]


def judge(name: str, obs: Obs, *, run_plan: plan.Plan) -> tuple[list[str], list[str]]:
    """The reasons ``obs`` fails, and the cautions it passes with
    (:class:`~dcp_invariant.evidence.diagnosis.Caution`), each in the order the rules found them."""
    found = _findings(name, obs, run_plan=run_plan)
    reasons = [r for r in found if not isinstance(r, Caution)]
    return reasons, [str(c) for c in found if isinstance(c, Caution)]


def _findings(name: str, obs: Obs, *, run_plan: plan.Plan) -> list[str]:
    scenario = run_plan.scenario(name)
    reasons = [f"error: {e}" for e in obs["errors"]]
    # Only a reshard records what it left out (its shape): the plan's rank-local components.
    if "left_out" in obs and obs["left_out"] != list(run_plan.rank_local):
        reasons.append(
            f"plan: the reshard left out {obs['left_out']}, the plan's rank-local components "
            f"are {list(run_plan.rank_local)}"
        )
    reasons += _ignored_recorded(obs, run_plan.ignored_attrs)
    reasons += FAMILIES[scenario.family].rule(scenario, obs)
    for key in ("commit", "baseline", "candidate"):
        if obs.get(key) is not None:
            reasons += _sealing(obs[key], key)
    return reasons


def _ignored_recorded(obs: Obs, ignoring: tuple[str, ...]) -> list[str]:
    """An attribute the plan ignores (``--ignore-attr``) is not among what a rank recorded."""
    if not ignoring:
        return []
    for arm in object_causes.WALKING_ARMS:
        for rank in (obs.get(arm) or {"ranks": []})["ranks"]:
            for walk in (rank.get("objects") or {}).values():
                found = sorted(p for p in walk or () if object_causes.ignored(p, ignoring))
                if found:
                    return [
                        f"plan: {arm} rank {rank['rank']} recorded {found[0]}, which it ignores"
                    ]
    return []


def _sealing(commit: CommitRecord, where: str) -> list[str]:
    """A seal either succeeded, with a receipt and no error, or failed, with an error and no
    receipt: the driver records exactly one of the two (``commit`` in
    dcp_invariant/suite/scenarios/commits.py)."""
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
    found, cautions = judge(name, obs, run_plan=run_plan)
    reasons = [*found, *extra]
    result = {
        "reasons": reasons,
        "scenario": name,
        "schema_version": schema.version_for(run_plan),
        "verdict": "fail" if reasons else "pass",
    }
    if run_plan.kind != "registered":
        result["warnings"] = cautions + warnings(obs["left_running"])
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
    # A scenario whose arms another scenario's observation holds is judged with them.
    judged = shared_arms.attached(observations, run_plan)
    return {
        name: result_record(name, judged[name], run_plan=run_plan, extra=across.get(name, ()))
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


def verdict_line(verdict: Literal["pass", "fail"], passed: int, failed: int) -> str:
    """A run's verdict in one line, the one wording ``run``, ``check()``, ``in-job``, ``verify``
    and the job summary use: ``fail: 10 passed, 1 failed``."""
    return f"{verdict}: {passed} passed, {failed} failed"


# --- across scenarios -----------------------------------------------------------------------


def consistency(observations: Mapping[str, Obs], *, run_plan: plan.Plan) -> dict[str, list[str]]:
    """Reasons, by scenario, where one observation contradicts its siblings.

    One fixture trained the same steps at the same world size must reach bit-identical state,
    and DCP then writes files of identical sizes: every scenario that trains is a repeat of the
    others. The registered fixture is exact across world sizes too (see docs/limits.md),
    so there its states agree at every world size. A forged value then disagrees with the
    siblings that recorded it independently, and so does a run that is not deterministic.
    """
    seen = Sightings()
    for name in run_plan.names:
        obs = observations.get(name)
        if obs is None:
            continue
        FAMILIES[run_plan.scenario(name).family].sightings(seen, name, obs, run_plan)
    return seen.disagreements()
