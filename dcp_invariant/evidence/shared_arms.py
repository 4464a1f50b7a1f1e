"""The arms a fixture run's scenarios at one world size share, recorded once.

``never_saves`` and ``repeat`` take the same steps in every resume-family scenario at a world
size w (dcp_invariant/suite/scenarios/resume.py), and the pool runs each once. The artifact
stores them in ``resume_<w>``'s observation alone; an ``async_resume`` scenario at w is judged
with them attached from there (:func:`attached`), by the runner, by ``check()`` and by
``verify`` alike. Pure: the verifier imports it.
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
    """Copies of ``observations`` as the artifact stores them: the shared arms in their owner's
    alone."""
    stored = copy.deepcopy(dict(observations))
    for name in sharing(run_plan):
        if name in stored:
            for arm in SHARED:
                stored[name].pop(arm, None)
    return stored


def attached(
    observations: Mapping[str, dict[str, Any]], run_plan: plan.Plan
) -> dict[str, dict[str, Any]]:
    """``observations`` with each sharing scenario's arms attached from its owner (None where
    the owner's observation is missing or lacks them): what each rule judges. The others as
    they are."""
    judged = dict(observations)
    for name in sharing(run_plan):
        if name not in judged:
            continue
        home = observations.get(run_plan.arms_home(name) or name)
        judged[name] = {
            **judged[name],
            **{arm: None if home is None else home.get(arm) for arm in SHARED},
        }
    return judged
