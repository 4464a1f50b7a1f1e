"""reshard_<a>_to_<b>: the user's fixture saved at world size a, loaded by fresh ranks at b.

Loaded must equal saved key by key (DTensors by global value), and every saved key must be
loaded by some rank. The K steps afterwards are not compared with the uninterrupted run at a: a
step at another world size reduces partial sums in another order, so its last bits legitimately
differ; nor with each other, as each rank's data and loss may be its own.

The source is ``resume_<a>``'s reference arm (N steps, the save, K more), which the pool runs
once for every scenario that saves at a. In a torchrun job (``in-job --resume-from``) it is the
first launch's, and its commit; the second launch's ranks load that.
"""

from __future__ import annotations

import copy
from typing import Any

from dcp_invariant.evidence.families.records import GroupRecord
from dcp_invariant.suite.pool import GroupOutcome
from dcp_invariant.suite.scenarios.common import REFERENCE_SNAPSHOTS, STORE_ROOT, ScenarioContext
from dcp_invariant.suite.scenarios.host import Host
from dcp_invariant.suite.scenarios.payloads import (
    FIXTURE_RESUME,
    FIXTURE_TRAIN,
    FixtureResume,
    FixtureTrain,
)


def train_payload(
    ctx: ScenarioContext, label: str, snapshots: str | None, steps_after: int, objects: bool
) -> FixtureTrain:
    return {
        "objects": objects,
        "ignored_attrs": list(ctx.run_plan.ignored_attrs),
        "checkpoint": ctx.candidate_id(label),
        "shape": ctx.run_plan.shape,
        "fixture": ctx.fixture,
        "fixture_args": ctx.run_plan.arguments,
        "snapshots": snapshots,
        "steps_after": steps_after,
        "steps_before": ctx.run_plan.steps_before,
    }


def left_out(ctx: ScenarioContext) -> list[str]:
    """The components a load at another world size leaves out: those declared rank-local."""
    sc = ctx.scenario
    return list(ctx.run_plan.rank_local) if sc.source_world_size != sc.target_world_size else []


def resume_group(
    ctx: ScenarioContext,
    *,
    compare_steps: bool,
    host: Host | None = None,
    name: str = "target",
    steps_after: int | None = None,
    reference: str = REFERENCE_SNAPSHOTS,
    objects: bool = True,
) -> GroupRecord:
    """Fresh ranks at the target world size load through the pointer and take K steps (on
    ``host``: another torch release's; else the scenario's), or ``steps_after``, compared with
    the arm that wrote the snapshots ``reference``; ``objects``: walk the app's objects too,
    where the steps are compared."""
    sc = ctx.scenario
    payload: FixtureResume = {
        "shape": ctx.run_plan.shape,
        "compare_steps": compare_steps,
        "objects": compare_steps and objects,
        "fixture": ctx.fixture,
        "fixture_args": ctx.run_plan.arguments,
        "rank_local": left_out(ctx),
        "reference": ctx.written(reference),
        "ignored_attrs": list(ctx.run_plan.ignored_attrs),
        "source_world_size": sc.source_world_size,
        "steps_after": ctx.run_plan.steps_after if steps_after is None else steps_after,
        "store": ctx.written(STORE_ROOT),
    }
    target = ctx.group_on(host or ctx.host, name, FIXTURE_RESUME(payload), sc.target_world_size)
    return ctx.target_record(target)


def reference_arm(ctx: ScenarioContext, payload: FixtureTrain) -> GroupOutcome:
    """The arm whose save a scenario seals and loads, run as ``reference``.

    A synchronous one (``payload`` without an async mode) is the same in ``resume_<a>``, every
    ``reshard_<a>_to_<b>``, ``half_written_<a>`` and every cross-release scenario at a: where
    more than one of them is planned the pool runs it once (:mod:`.shared_groups`), and each
    scenario gets a copy of its store and of its snapshots.
    """
    a = ctx.scenario.source_world_size
    shared = "async_mode" not in payload and any(
        s.family in ("reshard", "half_written", "cross_release") and s.source_world_size == a
        for s in ctx.run_plan.scenarios
    )
    return ctx.group("reference", FIXTURE_TRAIN(payload), a, shareable=shared)


def source_committed(ctx: ScenarioContext, obs: dict[str, Any]) -> bool:
    """The source (``resume_<a>``'s reference arm: N steps, the save, K more) into
    ``obs["source"]``, then its save committed into ``obs["commit"]``: whether it was promoted.

    The app's objects it walked are left out of the record: nothing here compares them (the
    target runs at another world size, or loads no generation), and they are recorded, settled,
    where they are (``resume_<a>``).
    """
    label = ctx.run_plan.baseline_label
    payload = train_payload(ctx, label, REFERENCE_SNAPSHOTS, ctx.run_plan.steps_after, objects=True)
    source = reference_arm(ctx, payload)
    obs["source"] = copy.deepcopy(source.record())
    for rank in obs["source"]["ranks"]:
        if rank is not None and "objects" in rank:
            rank["objects"] = {"final": None, "saved": None}
    if not source.ok:
        return False
    obs["commit"] = ctx.commit(label)
    return bool(obs["commit"]["promoted"])


def run(ctx: ScenarioContext) -> dict[str, Any]:
    the_plan = ctx.run_plan
    obs = ctx.begin(
        fixture=ctx.fixture,
        steps_before_save=the_plan.steps_before,
        steps_after=the_plan.steps_after,
        commit=None,
        target=None,
        left_out=left_out(ctx),
    )
    with ctx.recording(obs):
        if not source_committed(ctx, obs):
            return obs
        ctx.restart()  # the loading ranks hold nothing of the source's (in-job: a second launch)
        obs["target"] = resume_group(ctx, compare_steps=False)
    return obs
