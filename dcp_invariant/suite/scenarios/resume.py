"""resume_<w> and async_resume_<w>: the user's fixture, saved at step N, resumed at w.

async_resume saves with ``dcp.async_save`` and takes step N+1 while the write is held back; the
checkpoint must still hold the state at step N.

The uninterrupted arm runs twice, so a fixture that does not repeat itself is reported as
non-deterministic instead of the resume being blamed; then the first arm's checkpoint is sealed
and promoted, and a fresh group loads it through the pointer and takes the K steps again. In a
torchrun job (``in-job``) that group is every worker torchrun restarted.
"""

from __future__ import annotations

from typing import Any

from dcp_invariant.evidence import object_causes
from dcp_invariant.suite.scenarios.common import REFERENCE_SNAPSHOTS, ScenarioContext
from dcp_invariant.suite.scenarios.payloads import FIXTURE_TRAIN, FixtureTrain
from dcp_invariant.suite.scenarios.reshard import resume_group, train_payload


def _arm(ctx: ScenarioContext, label: str, snapshots: str | None) -> FixtureTrain:
    """An uninterrupted arm's payload: N steps, the save (async as the scenario says), K more."""
    sc = ctx.scenario
    payload = train_payload(ctx, label, snapshots, ctx.run_plan.steps_after, objects=True)
    if sc.async_mode:
        payload["async_mode"] = sc.async_mode
        payload["timeout"] = ctx.host.timeout
    return payload


def run(ctx: ScenarioContext) -> dict[str, Any]:
    sc, the_plan = ctx.scenario, ctx.run_plan
    fields: dict[str, Any] = {"save_mode": sc.async_mode} if sc.async_mode else {}
    obs = ctx.begin(
        fixture=ctx.fixture,
        steps_before_save=the_plan.steps_before,
        steps_after=the_plan.steps_after,
        reference=None,
        repeat=None,
        commit=None,
        target=None,
        **fields,
    )
    del obs["source"]
    with ctx.recording(obs):
        _arms_commit_resume(ctx, obs)
    # What the ranks recorded of the app's objects, made to repeat from run to run.
    object_causes.settle(obs["reference"], obs["repeat"], obs["target"], ctx.run_plan.ignored_attrs)
    return obs


def _arms_commit_resume(ctx: ScenarioContext, obs: dict[str, Any]) -> None:
    """The two uninterrupted arms, the commit of the first one's save, the resumed group."""
    sc = ctx.scenario
    label = ctx.run_plan.baseline_label
    reference = ctx.group(
        "reference", FIXTURE_TRAIN(_arm(ctx, label, REFERENCE_SNAPSHOTS)), sc.source_world_size
    )
    obs["reference"] = reference.record()
    if not reference.ok:
        return  # a fixture that fails or hangs once would do it again
    repeat = ctx.group(
        "repeat",
        # Only its records are compared (diagnosis.nondeterminism), never its values:
        # writing them would double what the run writes besides the checkpoints.
        FIXTURE_TRAIN(_arm(ctx, f"repeat-{label}", None)),
        sc.source_world_size,
    )
    obs["repeat"] = repeat.record()
    if not repeat.ok:
        return
    obs["commit"] = ctx.commit(label)
    if not obs["commit"]["promoted"]:
        return
    ctx.restart()  # the loading ranks hold nothing of the arms' (in-job: torchrun's restart)
    obs["target"] = resume_group(ctx, compare_steps=True)
