"""A fixture run in this process for the live tests: the suite's observations, and the reasons
the rules give each scenario of the plan as the probe left it (an app that saves itself has
scenarios of its own). A failing scenario's worker logs are printed, so they reach pytest's
report with the reasons."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dcp_invariant import plan
from dcp_invariant.evidence import rules
from dcp_invariant.suite import runner

Reasons = dict[str, list[str]]


def run(
    spec: str,
    names: Sequence[str],
    world_sizes: tuple[int, ...] = (1, 2),
    rank_local: tuple[str, ...] = (),
    ignored_attrs: tuple[str, ...] = (),
    fixture_args: dict[str, Any] | None = None,
) -> tuple[Reasons, dict[str, dict[str, Any]]]:
    the_plan = plan.fixture_plan(
        spec,
        world_sizes,
        fixture_args=fixture_args,
        rank_local=rank_local,
        ignored_attrs=ignored_attrs,
    )
    logs: list[str] = []

    def keep_logs(done: runner.Finished) -> None:
        if done.logs:
            logs.append("\n".join([f"{done.name}:", *(log.text for log in done.logs)]))

    suite = runner.run_suite(run_plan=the_plan, names=names, on_finish=keep_logs)
    derived = {
        n: rules.derive(n, obs, run_plan=suite.run_plan) for n, obs in suite.observations.items()
    }
    print("\n".join(logs))
    return derived, suite.observations
