"""resume_<w> and async_resume_<w>: the user's fixture, saved at step N, resumed at w.

async_resume saves with ``dcp.async_save`` and takes step N+1 while the write is held back; the
checkpoint must still hold the state at step N.

Three uninterrupted arms take the N+K steps:

- ``never_saves`` never saves, nor reads ``state_dict()``: a save, or the read it starts with,
  that changes training (``get_state_dict`` stepping an optimizer that has no state yet) shows
  as the arms that save parting from it (``the save changed training``);
- ``repeat`` saves at step N, synchronously, and so does ``reference``: two runs that must agree
  key by key, so a fixture that does not repeat itself is reported as non-deterministic instead
  of the resume being blamed;
- ``reference`` saves as the scenario says (synchronously, or async_save's mode); its checkpoint
  is sealed and promoted, and a fresh group loads it through the pointer and takes the K steps
  again. In a torchrun job (``in-job``) that group is every worker torchrun restarted.

Where, after the K resumed steps, only the app's generators differ from the uninterrupted run's
while every step matched, an uninterrupted arm and a fresh resumed group run again, on to
``plan.further_steps(K)`` steps (``further``): the generator fails only if a later step shows it
(dcp_invariant/evidence/families/_drawn_later.py).

``never_saves`` and ``repeat`` are the same at one world size whatever the scenario, so on this
machine's pool the scenarios at that size share one run of each (:mod:`.shared_groups`); the
artifact records them once, in ``resume_<w>``'s observation
(dcp_invariant/evidence/shared_arms.py).
"""

from __future__ import annotations

import copy
from typing import Any

from dcp_invariant import plan
from dcp_invariant.evidence import object_causes
from dcp_invariant.evidence.families._drawn_later import drawn_later
from dcp_invariant.suite.scenarios.common import REFERENCE_SNAPSHOTS, SNAPSHOTS, ScenarioContext
from dcp_invariant.suite.scenarios.payloads import FIXTURE_NEVER_SAVES, FIXTURE_TRAIN, FixtureTrain
from dcp_invariant.suite.scenarios.reshard import reference_arm, resume_group, train_payload

# Where the repeat arm saves: outside the store, which a shared group's scenarios each get a copy
# of; its save is never sealed. The arm run further (:func:`_further`) saves beside it, and
# writes the snapshots its resumed group compares with beside the reference's.
REPEAT_SAVES = "repeat-save"
FURTHER_SAVES = "further-save"
FURTHER_SNAPSHOTS = f"{SNAPSHOTS}/further"


def _arm(
    ctx: ScenarioContext, label: str, snapshots: str | None, *, as_planned: bool
) -> FixtureTrain:
    """An uninterrupted arm's payload: N steps, the save (``as_planned``: async as the scenario
    says; else synchronous), K more."""
    sc = ctx.scenario
    payload = train_payload(ctx, label, snapshots, ctx.run_plan.steps_after, objects=True)
    if sc.async_mode and as_planned:
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
        never_saves=None,
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
    object_causes.settle(
        obs["reference"],
        obs["repeat"],
        obs["target"],
        ctx.run_plan.ignored_attrs,
        never_saves=obs["never_saves"],
    )
    if ctx.host.runs_further and drawn_later(obs):
        with ctx.recording(obs):
            obs["further"] = _further(ctx)
    return obs


def _further(ctx: ScenarioContext) -> dict[str, Any]:
    """Both arms again, run on to :func:`plan.further_steps` resumed steps: the uninterrupted
    one (its save synchronous and never sealed, as ``repeat``'s, so the scenarios at one world
    size share it) and a fresh group that loads the committed save again. Neither walks the
    app's objects: only their steps are compared, and walks would hold values no second run
    repeats (the global RNGs), which nothing settles here."""
    sc, label = ctx.scenario, ctx.run_plan.baseline_label
    steps = plan.further_steps(ctx.run_plan.steps_after)
    payload = train_payload(ctx, label, FURTHER_SNAPSHOTS, steps, objects=False)
    payload["checkpoint"] = f"{FURTHER_SAVES}/{label}"
    reference = ctx.group(
        "further_reference", FIXTURE_TRAIN(payload), sc.source_world_size, shareable=True
    )
    further: dict[str, Any] = {
        "steps_after": steps,
        "reference": copy.deepcopy(reference.record()),
        "target": None,
    }
    if reference.ok:
        target = resume_group(
            ctx,
            compare_steps=True,
            name="further_target",
            steps_after=steps,
            reference=FURTHER_SNAPSHOTS,
            objects=False,
        )
        further["target"] = target
    return further


def _arms_commit_resume(ctx: ScenarioContext, obs: dict[str, Any]) -> None:
    """The three uninterrupted arms, the commit of the reference's save, the resumed group."""
    sc, the_plan = ctx.scenario, ctx.run_plan
    label = the_plan.baseline_label
    reference = reference_arm(ctx, _arm(ctx, label, REFERENCE_SNAPSHOTS, as_planned=True))
    obs["reference"] = copy.deepcopy(reference.record())
    if not reference.ok:
        return  # a fixture that fails or hangs once would do it again
    never_saves = ctx.group(
        "never_saves",
        FIXTURE_NEVER_SAVES(
            {
                "shape": the_plan.shape,
                "fixture": ctx.fixture,
                "fixture_args": the_plan.arguments,
                "steps_after": the_plan.steps_after,
                "steps_before": the_plan.steps_before,
                "ignored_attrs": list(the_plan.ignored_attrs),
            }
        ),
        sc.source_world_size,
        shareable=True,
    )
    # A copy: a shared group's record is every sharing scenario's, and settle() edits its own.
    obs["never_saves"] = copy.deepcopy(never_saves.record())
    if not never_saves.ok:
        return
    # Only its records are compared (diagnosis.nondeterminism), never its values: writing them
    # would double what the run writes besides the checkpoints. It saves synchronously in
    # every scenario, so the scenarios at one world size share it.
    payload = _arm(ctx, label, None, as_planned=False)
    payload["checkpoint"] = f"{REPEAT_SAVES}/{label}"
    repeat = ctx.group("repeat", FIXTURE_TRAIN(payload), sc.source_world_size, shareable=True)
    obs["repeat"] = copy.deepcopy(repeat.record())
    if not repeat.ok:
        return
    obs["commit"] = ctx.commit(label)
    if not obs["commit"]["promoted"]:
        return
    ctx.restart()  # the loading ranks hold nothing of the arms' (in-job: torchrun's restart)
    obs["target"] = resume_group(ctx, compare_steps=True)
