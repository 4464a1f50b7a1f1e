"""The arms a fixture run's scenarios at one world size share, recorded once.

``never_saves`` and ``repeat`` take the same steps in every resume-family scenario at a world
size w (dcp_invariant/suite/scenarios/resume.py), and this machine's pool runs each once. The
artifact of a fixture run stores them in ``resume_<w>``'s observation, and null in each
``async_resume`` scenario's at w, which is judged with them attached from there
(:func:`attached`), in the artifact ``run`` and ``check()`` write and by ``verify`` alike. An
``in-job`` run shares nothing (each scenario runs its own arms in the job), and keeps them all.
Pure: the verifier imports it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from dcp_invariant import plan

SHARED = ("never_saves", "repeat")


def sharing(run_plan: plan.Plan) -> list[str]:
    """The scenarios whose shared arms another scenario's observation holds."""
    return [name for name in run_plan.names if run_plan.arms_home(name) is not None]


def recorded_once(
    observations: Mapping[str, dict[str, Any]], run_plan: plan.Plan
) -> dict[str, dict[str, Any]]:
    """Copies of ``observations`` as the artifact stores them: each sharing scenario's arms set
    to None where its home holds them. Where the home does not (its own first arm failed, so
    it never ran them), the scenario keeps the ones it ran."""
    stored = copy.deepcopy(dict(observations))
    for name in sharing(run_plan):
        home = stored.get(run_plan.arms_home(name) or name)
        if name in stored and home is not None and all(home.get(a) is not None for a in SHARED):
            stored[name].update(dict.fromkeys(SHARED))
    return stored


def attached(
    observations: Mapping[str, dict[str, Any]], run_plan: plan.Plan
) -> dict[str, dict[str, Any]]:
    """``observations`` with each sharing scenario's missing arms taken from its home: what
    each rule judges. The others, and arms a scenario holds itself, as they are."""
    judged = dict(observations)
    for name in sharing(run_plan):
        obs = judged.get(name)
        if obs is None or all(obs.get(arm) is not None for arm in SHARED):
            continue
        home = observations.get(run_plan.arms_home(name) or name) or {}
        judged[name] = {
            **obs,
            **{arm: obs.get(arm) if obs.get(arm) is not None else home.get(arm) for arm in SHARED},
        }
    return judged
