"""The restart's torchrun agent, started ahead of need (dcp_invariant/suite/torchrun/agent.py):
the runner starts it before its probes and the restart scenario runs that very agent; a run
that stops at a probe kills it, leaving no process. Real runs, on this machine's worker pool.
(tests/suite/test_live.py holds the launcher's own standby protocol.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dcp_invariant import plan
from dcp_invariant.errors import FixtureProblem
from dcp_invariant.evidence import rules
from dcp_invariant.suite import runner
from dcp_invariant.suite.torchrun import agent

pytestmark = pytest.mark.live
RESTART = "elastic_restart_2_to_2"


@pytest.fixture
def agents(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """What happened, in order: each agent made, each probe, each agent run or closed."""
    events: list[tuple[str, Any]] = []
    made, ran, closed = agent.Agent.__init__, agent.Agent.run, agent.Agent.close

    def init(self: agent.Agent, pool: Any, workdir: Path) -> None:
        made(self, pool, workdir)
        events.append(("made", self))

    def run(self: agent.Agent, timeout: float) -> tuple[int, bool, list[str]]:
        events.append(("run", self))
        return ran(self, timeout)

    def close(self: agent.Agent) -> None:
        events.append(("close", self))
        closed(self)

    probe = runner._probe

    def probed(*args: Any) -> dict[str, str]:
        events.append(("probe", None))
        return probe(*args)

    monkeypatch.setattr(agent.Agent, "__init__", init)
    monkeypatch.setattr(agent.Agent, "run", run)
    monkeypatch.setattr(agent.Agent, "close", close)
    monkeypatch.setattr(runner, "_probe", probed)
    return events


def test_the_restart_runs_the_agent_started_before_the_probe(
    agents: list[tuple[str, Any]],
) -> None:
    suite = runner.run_suite(run_plan=plan.REGISTERED, names=[RESTART])
    assert rules.derive(RESTART, suite.observations[RESTART], run_plan=plan.REGISTERED) == []
    kinds = [kind for kind, _ in agents]
    assert kinds[:3] == ["made", "probe", "run"], kinds
    assert kinds.count("made") == 1, "the scenario started an agent of its own"
    started = agents[0][1]
    assert started._proc.poll() is not None, "the agent outlived its run"


def test_a_plan_without_the_restart_starts_no_agent(agents: list[tuple[str, Any]]) -> None:
    runner.run_suite(run_plan=plan.REGISTERED, names=["training_1_to_1"])
    assert [kind for kind, _ in agents] == ["probe"]


def test_a_run_stopped_by_its_fixture_probe_kills_the_waiting_agent(
    agents: list[tuple[str, Any]],
) -> None:
    """Bad input is said as soon as the probe finds it, and the agent is gone with the run."""
    with pytest.raises(FixtureProblem, match="step"):
        runner.run_suite(run_plan=plan.fixture_plan("fixture_loops:no_step", (1, 2)))
    kinds = [kind for kind, _ in agents]
    assert kinds == ["made", "probe", "close"], kinds
    assert agents[0][1]._proc.poll() is not None, "the waiting agent outlived the run"
