"""The restart's torchrun agent, started ahead of need (dcp_invariant/suite/torchrun/agent.py):
the runner starts it before its probes where a core is idle, and the restart scenario runs that
very agent; an agent no scenario runs is killed by the run's end, leaving no process; on one
core none starts ahead. Real runs, on this machine's worker pool. (tests/suite/test_live.py
holds the launcher's own standby protocol.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import proc_state
import pytest

from dcp_invariant import plan
from dcp_invariant.errors import FixtureProblem
from dcp_invariant.evidence import rules
from dcp_invariant.suite import runner
from dcp_invariant.suite.pool import WorkerPool
from dcp_invariant.suite.torchrun import agent, launch

pytestmark = pytest.mark.live
RESTART = "elastic_restart_2_to_2"
Events = list[tuple[str, Any]]


@pytest.fixture
def agents(monkeypatch: pytest.MonkeyPatch) -> Events:
    """What happened, in order: each agent made, each probe, each agent run or closed (with
    whether its process still ran as close began)."""
    events: Events = []
    made, ran, closed = agent.Agent.__init__, agent.Agent.run, agent.Agent.close

    def init(self: agent.Agent, pool: Any, workdir: Path) -> None:
        made(self, pool, workdir)
        events.append(("made", self))

    def run(self: agent.Agent, timeout: float) -> tuple[int, bool, list[str]]:
        events.append(("run", self))
        return ran(self, timeout)

    def close(self: agent.Agent) -> None:
        events.append(("close", proc_state.alive(self._proc.pid)))
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


def _gone(events: Events) -> None:
    """Every agent made is gone, not left a zombie: reaped by the run."""
    for kind, made in events:
        if kind == "made":
            assert made._proc.returncode is not None, "an agent was not reaped"
            assert not proc_state.alive(made._proc.pid)


def test_the_restart_runs_the_agent_started_before_the_probe(agents: Events) -> None:
    suite = runner.run_suite(run_plan=plan.REGISTERED, names=[RESTART])
    assert rules.derive(RESTART, suite.observations[RESTART], run_plan=plan.REGISTERED) == []
    kinds = [kind for kind, _ in agents]
    assert kinds == ["made", "probe", "run", "close"], kinds
    _gone(agents)


def test_an_agent_no_scenario_ran_is_killed_by_the_runs_end(agents: Events) -> None:
    """The restart stops before torchrun (its baseline's second step raises; the probe takes
    one): the waiting agent, which no cancellation reached, is killed when the run ends."""
    the_plan = plan.fixture_plan("fixture_loops:raises_in_step", (1, 2))
    runner.run_suite(run_plan=the_plan, names=[RESTART])
    assert [kind for kind, _ in agents] == ["made", "probe", "close"], agents
    assert agents[-1] == ("close", True), "close found the agent already ended"
    _gone(agents)


def test_a_run_stopped_by_its_fixture_probe_leaves_no_agent(agents: Events) -> None:
    """Bad input is said as soon as the probe finds it, and the agent is gone with the run."""
    with pytest.raises(FixtureProblem, match="step"):
        runner.run_suite(run_plan=plan.fixture_plan("fixture_loops:no_step", (1, 2)))
    assert [kind for kind, _ in agents] == ["made", "probe", "close"], agents
    _gone(agents)


def test_a_plan_without_the_restart_starts_no_agent(agents: Events) -> None:
    runner.run_suite(run_plan=plan.REGISTERED, names=["training_1_to_1"])
    assert [kind for kind, _ in agents] == ["probe"]


def test_on_one_core_the_restart_starts_its_agent_after_the_probes(
    agents: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The probes say bad input first, and on one core an agent importing torch would slow them."""
    monkeypatch.setattr(WorkerPool, "idle_cores", lambda self: 0)
    suite = runner.run_suite(run_plan=plan.REGISTERED, names=[RESTART])
    assert rules.derive(RESTART, suite.observations[RESTART], run_plan=plan.REGISTERED) == []
    assert [kind for kind, _ in agents] == ["probe", "made", "run"], agents
    _gone(agents)


def test_an_agent_closed_while_it_imports_is_killed_at_once_with_the_users_path_kept_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that ends early does not wait for its agent's import: close kills it (end of input
    alone would end it only once torch is imported). Its own import path is this package's; the
    user's (here, where sys.path holds a sitecustomize.py) is kept for its ranks, after go."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("open('sitecustomize-ran', 'w').close()\n")
    monkeypatch.syspath_prepend(str(user))
    given: list[dict[str, str]] = []
    popen = subprocess.Popen

    def spied(*args: Any, **kwargs: Any) -> Any:
        given.append(kwargs["env"])
        return popen(*args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", spied)  # the module agent.py starts it with
    pool = WorkerPool(60.0)
    waiting = agent.Agent(pool, tmp_path / "restart")
    waiting.close()
    assert waiting._proc.returncode is not None and waiting._proc.returncode != 0
    assert not waiting.usable()
    [env] = given
    assert str(user) not in env["PYTHONPATH"].split(os.pathsep)
    assert str(user) in env[launch.RANKS_PATH_ENV].split(os.pathsep)
    assert not (tmp_path / "restart" / "sitecustomize-ran").exists()


def test_a_fixture_found_through_an_empty_path_entry_reaches_the_restarts_ranks(
    tmp_path: Path,
) -> None:
    """check() called from python -c (as from standard input or a notebook, whose sys.path
    starts with '', the current directory) on a fixture module there: the pool's workers find
    it, as multiprocessing gives them that directory; torchrun's ranks, which work in the
    scenario's directory, must find it too (they did not: the restart failed, no rank reported)."""
    (tmp_path / "here_fixture.py").write_text("from fixture_loops import correct as fixture\n")
    code = (
        "import sys, dcp_invariant\n"
        "assert sys.path[0] == ''\n"
        "report = dcp_invariant.check('here_fixture:fixture', world_sizes=(2,), "
        f"output_dir={str(tmp_path / 'evidence')!r})\n"
        f"print(report.results[{RESTART!r}].reasons)\n"
    )
    tests = str(Path(__file__).resolve().parents[1])  # fixture_loops
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tests, *sys.path[1:]]))
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.stdout.strip().splitlines()[-1:] == ["()"], done.stdout + done.stderr
