"""upgrade_<A>_to_<B>_<w> and downgrade_<A>_to_<B>_<w>: saved by the installed torch A, resumed
by fresh ranks running torch B (``run --resume-with-torch B``).

The save is ``resume_<w>``'s reference arm (N steps, the save, K more), run once for every
scenario that saves at w, and committed through the pointer. Then two groups of ranks running
B (:mod:`dcp_invariant.suite.release_env`) each load it through the pointer and take the K
steps: ``target``, the resume under test, and ``continued``, B's own continuation from the same
state. Loaded must equal saved key by key; the K steps are compared between the two groups on
B only, never with A's: kernels may differ between releases, and a difference there would be
no fault of the checkpoint.
"""

from __future__ import annotations

from typing import Any

from dcp_invariant.suite.scenarios.common import ScenarioContext
from dcp_invariant.suite.scenarios.reshard import resume_group, source_committed


def run(ctx: ScenarioContext) -> dict[str, Any]:
    the_plan, release = ctx.run_plan, ctx.scenario.loading_release
    assert release is not None, "a cross_release scenario names the release that loads"
    other = ctx.releases[release]
    obs = ctx.begin(
        fixture=ctx.fixture,
        steps_before_save=the_plan.steps_before,
        steps_after=the_plan.steps_after,
        commit=None,
        continued=None,
        target=None,
        torch={"saved": other.saved_torch, "loaded": other.loaded_torch},
    )
    with ctx.recording(obs):
        if not source_committed(ctx, obs):
            return obs
        ctx.restart()
        obs["continued"] = resume_group(ctx, compare_steps=False, host=other.host, name="continued")
        obs["target"] = resume_group(ctx, compare_steps=False, host=other.host)
    return obs
