"""Driver-side pieces every scenario shares: its workspace, its worker groups, its commits.

Drivers never import torch; they start worker groups, run the commit protocol on what the
workers wrote, and assemble the observation record. They ask all of that of the scenario's
:class:`.host.Host`: the runner's worker pool, or the ranks of the user's torchrun job.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcp_invariant import plan
from dcp_invariant.canonical import CanonicalJSONError
from dcp_invariant.commit import CheckpointStore, CommitError
from dcp_invariant.dcp_layout import METADATA_FILE
from dcp_invariant.evidence import schema
from dcp_invariant.evidence.families.records import (
    CommitRecord,
    GroupRecord,
    ObservationBase,
)
from dcp_invariant.suite.pool import GroupOutcome
from dcp_invariant.suite.scenarios.commits import Interner, pointer_label
from dcp_invariant.suite.scenarios.host import Damage, Host, ReleaseHost
from dcp_invariant.suite.scenarios.payloads import (
    LOADS,
    TRAIN_AND_SAVE,
    Call,
    Crash,
    PlannedSave,
    TrainAndSave,
)
from dcp_invariant.suite.workspace import ENVIRONMENT_ERRNOS, environment_problem

STORE_ROOT = "ckpt"  # relative to the workspace: checkpoint ids never carry an absolute path
# The values at each phase of the arm whose save a later group loads and compares with: a
# resume's uninterrupted arm, a reshard's source (in a torchrun job, the first launch's arm).
SNAPSHOTS = "snapshots"
REFERENCE_SNAPSHOTS = f"{SNAPSHOTS}/reference"
EMPTY_GROUP: GroupRecord = {"exit_codes": [], "timed_out": False, "ranks": []}
# Failures of the protocol or of what workers left on disk: the scenario records them and fails,
# the rest of the suite goes on. Anything else is a bug in this package and stops the run.
DRIVER_ERRORS = (CommitError, CanonicalJSONError, OSError, KeyError)


@dataclass
class ScenarioContext:
    scenario: plan.Scenario
    host: Host
    workdir: Path
    fixture: str
    run_plan: plan.Plan
    intern: Interner = field(default_factory=Interner)
    outcomes: list[tuple[str, GroupOutcome]] = field(default_factory=list)
    tasks_run: list[str] = field(default_factory=list)
    # What the console shows about a failure and the evidence must not hold (paths, digests).
    notes: list[str] = field(default_factory=list)
    # Per group, the programs its processes left running (killed when it ended).
    stragglers: dict[str, set[str]] = field(default_factory=dict)
    # Errors the host found that no driver sees (a rank of a job that read another pointer).
    host_errors: list[str] = field(default_factory=list)
    # Hosts whose ranks run another torch release, by release (``run --resume-with-torch``).
    releases: dict[str, ReleaseHost] = field(default_factory=dict)

    @property
    def store(self) -> CheckpointStore:
        # DCP's save ends with .metadata; an app's own save ends when every rank's save()
        # returned, which the group's outcome says before anything is sealed.
        app = self.run_plan.checkpointing == "app"
        return CheckpointStore(self.workdir / STORE_ROOT, marker=None if app else METADATA_FILE)

    def group(
        self, name: str, call: Call, world_size: int, *, shareable: bool = False
    ) -> GroupOutcome:
        """Run ``call`` (a task of :mod:`.payloads` with its payload) on a fresh group.

        ``shareable``: another scenario's identical group may have run it already; this one
        then gets that group's outcome and a copy of its store (:mod:`.shared_groups`).
        """
        return self.group_on(self.host, name, call, world_size, shareable=shareable)

    def group_on(
        self, host: Host, name: str, call: Call, world_size: int, *, shareable: bool = False
    ) -> GroupOutcome:
        """:meth:`group` on another host: another torch release's (:class:`.host.ReleaseHost`)."""
        self.tasks_run.append(call.task)
        outcome = host.group(name, call, world_size, self.workdir, shareable=shareable)
        self.outcomes.append((name, outcome))
        self.left_running(name, outcome.stragglers)
        return outcome

    def left_running(self, group: str, programs: list[str]) -> None:
        if programs:
            self.stragglers.setdefault(group, set()).update(programs)

    def left_running_record(self) -> list[dict[str, Any]]:
        """What the groups left running, as a fixture run's observation records it."""
        return [
            {"group": group, "programs": sorted(programs)}
            for group, programs in sorted(self.stragglers.items())
        ]

    def load_attempted(self) -> bool:
        return any(task in LOADS for task in self.tasks_run)

    def begin(self, **fields: Any) -> dict[str, Any]:
        """The observation with every field present, so a scenario cut short still has its shape."""
        sc = self.scenario
        base: ObservationBase = {
            "errors": [],
            "scenario": sc.name,
            "schema_version": schema.version_for(self.run_plan),
            "source_world_size": sc.source_world_size,
            "target_world_size": sc.target_world_size,
        }
        return {**base, "source": EMPTY_GROUP, **fields}

    @contextmanager
    def recording(self, obs: dict[str, Any]) -> Iterator[None]:
        """Turn a driver error into a recorded, run-independent reason instead of a crash."""
        try:
            yield
        except OSError as exc:
            if exc.errno in ENVIRONMENT_ERRNOS:
                raise environment_problem(exc, "the run's workspace") from exc
            obs["errors"].append(f"the driver stopped on {type(exc).__name__}")
            self.notes.append(f"{type(exc).__name__}: {exc}")
        except DRIVER_ERRORS as exc:
            obs["errors"].append(f"the driver stopped on {type(exc).__name__}")
            self.notes.append(f"{type(exc).__name__}: {exc}")

    def candidate_id(self, label: str) -> str:
        return f"{STORE_ROOT}/candidates/{label}"

    def pointer_label(self) -> str | None:
        return pointer_label(self.store, self.intern)

    def target_record(self, outcome: GroupOutcome) -> GroupRecord:
        """A loading group's record, with each rank's raw generation digest turned into a label."""
        record = outcome.record()
        record["ranks"] = [
            {**r, "generation": self.intern("receipt", r["generation"])} for r in record["ranks"]
        ]
        return record

    def train(
        self,
        obs: dict[str, Any],
        saves: list[tuple[str, int]],
        *,
        reference_step: bool,
        crash: Crash | None = None,
    ) -> GroupOutcome:
        """Train the fixture, saving ``(label, after_steps)`` in turn; ``crash`` kills the last save."""
        plan: list[PlannedSave] = [
            {"after_steps": steps, "checkpoint": self.candidate_id(label)} for label, steps in saves
        ]
        if crash is not None:
            plan[-1]["crash"] = crash
        payload: TrainAndSave = {
            "shape": self.run_plan.shape,
            "fixture": self.fixture,
            "fixture_args": self.run_plan.arguments,
            "saves": plan,
            "reference_step": reference_step,
        }
        outcome = self.group(
            "source", TRAIN_AND_SAVE(payload), self.scenario.source_world_size, shareable=True
        )
        obs["source"] = outcome.record()
        return outcome

    def commit_baseline(self, obs: dict[str, Any]) -> bool:
        """Train, save the baseline with the uninterrupted next step as reference, commit it."""
        label = self.run_plan.baseline_label
        if not self.train(obs, [(label, self.run_plan.steps_before)], reference_step=True).ok:
            return False
        obs["commit"] = self.commit(label)
        return bool(obs["commit"]["promoted"])

    def commit(self, label: str, damage: Damage | None = None) -> CommitRecord:
        """Seal ``label``, let ``damage`` act on the sealed candidate, then try to promote it."""
        record, errors = self.host.commit(self.store, label, self.intern, damage)
        self.host_errors += errors
        return record

    def restart(self) -> None:
        """From here on, groups run in processes that ran none of this scenario's groups before
        (:meth:`.host.Host.restart`): a no-op on the pool, torchrun's restart in a job."""
        self.host.restart()

    def written(self, name: str) -> str:
        """How a task finds ``name``, a file this scenario's groups wrote (a store, snapshots)."""
        return self.host.written(self.workdir, name)

    def finished(self, obs: dict[str, Any]) -> dict[str, Any]:
        """The driver's observation as either host records it: with the errors the host found
        and, for a user's fixture, what the scenario's groups left running."""
        obs["errors"] += self.host_errors
        if self.run_plan.kind != "registered":
            obs["left_running"] = self.left_running_record()
        return obs
