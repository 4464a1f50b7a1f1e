"""What a driver sends each worker task: one TypedDict a task, and the task paired with it.

Drivers (which never import torch) build these, and the tasks in :mod:`.tasks` and
:mod:`.fixture_tasks` annotate their payload with them. Each task is named once, below, as a
:class:`Task` of its payload type: a driver calls it with the payload (``FIXTURE_TRAIN({...})``),
so mypy holds the keys a driver sends to the keys its task reads, and a test holds each
:class:`Task` to its function's annotation. A payload crosses into the worker as it is built
(pickled, or as JSON for torchrun's ranks), so every value is plain data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, NotRequired, TypedDict, TypeVar

from dcp_invariant import plan

# The fixture's keyword arguments (``--fixture-arg``), sorted by name; values are JSON.
FixtureArgs = dict[str, Any]


class RuntimeVersions(TypedDict):
    """The probe of torch's and NumPy's versions needs nothing."""


class FixtureImports(TypedDict):
    """Another release's probe: the fixture resolves there, and which torch the ranks import."""

    fixture: str
    fixture_args: dict[str, Any]


class Crash(TypedDict):
    """The rank that dies in the middle of a save, after writing its shard, and its exit code."""

    rank: int
    exit_code: int


class PlannedSave(TypedDict):
    after_steps: int
    checkpoint: str  # the candidate's id, relative to the scenario's workspace
    crash: NotRequired[Crash]


class TrainAndSave(TypedDict):
    shape: plan.AppShape  # who saves and loads, the tool or the app, and what the app declares
    fixture: str
    fixture_args: FixtureArgs
    saves: list[PlannedSave]
    reference_step: bool  # take the uninterrupted next step after the last save


class LoadAndStep(TypedDict):
    shape: plan.AppShape  # who saves and loads, the tool or the app, and what the app declares
    fixture: str
    fixture_args: FixtureArgs
    store: str
    # What torchrun's restarted ranks add to their report: the restart as they saw it.
    extra: NotRequired[dict[str, Any]]


class DTensorSave(TypedDict):
    checkpoint: str


class DTensorLoad(TypedDict):
    store: str


class FixtureProbe(TypedDict):
    fixture: str
    fixture_args: FixtureArgs
    rank_local: list[str]


# The fixture probe's phases in order: its record names the one under way, so a probe that
# times out is reported by where it stuck. "done": the task returned; only the exit is left.
ProbePhase = Literal["build", "state_dict", "step", "state_dict_after_step", "done"]


class FixtureProbeRecord(TypedDict):
    """What the fixture probe reports, rewritten as each phase starts."""

    problem: str | None  # an interface problem: bad input, the message says what to change
    phase: ProbePhase
    threads: list[str]  # at "done": the non-daemon threads still running, which exit waits for
    # Who checkpoints the app built and what it declares (:class:`..fixture.Anchored`); None
    # before it is built.
    shape: plan.AppShape | None


class FixtureTrain(TypedDict):
    checkpoint: str
    shape: plan.AppShape  # who saves and loads, the tool or the app, and what the app declares
    fixture: str
    fixture_args: FixtureArgs
    snapshots: str | None  # None: no later group reads this arm's values
    steps_after: int
    steps_before: int
    # Record the app's own objects (ranks/app_objects.py): an uninterrupted arm that a resume
    # is compared with does; a reshard's source, compared at no world size of its own, does not.
    objects: bool
    ignored_attrs: list[str]  # attribute paths the walk leaves out (--ignore-attr)
    # An async_resume arm's save: dcp.async_save in this mode (or the app's own, "app"), each
    # wait bounded by ``timeout``.
    async_mode: NotRequired[plan.AsyncMode]
    timeout: NotRequired[float]


class FixtureNeverSaves(TypedDict):
    """N+K steps of the fixture, never saving and never reading ``state_dict()``: the reference
    a save is held to (``get_state_dict`` can step an optimizer, pytorch#140898)."""

    shape: plan.AppShape
    fixture: str
    fixture_args: FixtureArgs
    steps_after: int
    steps_before: int
    ignored_attrs: list[str]


class FixtureResume(TypedDict):
    compare_steps: bool
    # Walk the app's objects right after the load and at the end (ranks/app_objects.py), where a
    # rule compares them: a resume's resumed group does; the group a resume runs further, whose
    # steps alone are compared, does not.
    objects: bool
    shape: plan.AppShape  # who saves and loads, the tool or the app, and what the app declares
    fixture: str
    fixture_args: FixtureArgs
    rank_local: list[str]  # components left out of the load: each rank keeps its own
    reference: str  # the snapshots of the arm whose save is loaded
    ignored_attrs: list[str]
    source_world_size: int
    steps_after: int
    store: str


class FixtureLoadCut(TypedDict):
    """Fresh ranks point the app's own load() at a checkpoint cut short (half_written)."""

    shape: plan.AppShape
    directory: str  # the copy cut short, relative to the scenario's workspace
    fixture: str
    fixture_args: FixtureArgs


class Elastic(TypedDict):
    """The elastic scenario's job, written as JSON for torchrun's ranks
    (:mod:`dcp_invariant.suite.torchrun.elastic_rank`)."""

    dying_rank: int
    exit_code: int
    shape: plan.AppShape  # who saves and loads, the tool or the app, and what the app declares
    fixture: str
    fixture_args: FixtureArgs
    store: str
    timeout: float


P = TypeVar("P", bound=Mapping[str, Any])


@dataclass(frozen=True)
class Call:
    """A task with its payload: what every rank of a group runs (:meth:`.pool.WorkerPool.run_group`).

    ``task`` is ``"module:function"``, imported by the worker. The drivers make these through
    :class:`Task`; the tests' own tasks (``tests/worker_tasks.py``) are called by name.
    """

    task: str
    payload: Mapping[str, Any]


@dataclass(frozen=True)
class Task(Generic[P]):
    """A worker task, ``"module:function"``, and the payload type its function reads."""

    ref: str
    payload: type[P]

    def __call__(self, payload: P) -> Call:
        return Call(self.ref, payload)


_TASKS: Final = "dcp_invariant.ranks.tasks"
_FIXTURE_TASKS: Final = "dcp_invariant.ranks.fixture_tasks"
RUNTIME_VERSIONS: Final = Task(f"{_TASKS}:runtime_versions", RuntimeVersions)
FIXTURE_IMPORTS: Final = Task(f"{_TASKS}:fixture_imports", FixtureImports)
TRAIN_AND_SAVE: Final = Task(f"{_TASKS}:train_and_save", TrainAndSave)
LOAD_AND_STEP: Final = Task(f"{_TASKS}:load_and_step", LoadAndStep)
DTENSOR_SAVE: Final = Task(f"{_TASKS}:dtensor_save", DTensorSave)
DTENSOR_LOAD: Final = Task(f"{_TASKS}:dtensor_load", DTensorLoad)
FIXTURE_PROBE: Final = Task(f"{_FIXTURE_TASKS}:fixture_probe", FixtureProbe)
FIXTURE_TRAIN: Final = Task(f"{_FIXTURE_TASKS}:fixture_train", FixtureTrain)
FIXTURE_NEVER_SAVES: Final = Task(f"{_FIXTURE_TASKS}:fixture_never_saves", FixtureNeverSaves)
FIXTURE_RESUME: Final = Task(f"{_FIXTURE_TASKS}:fixture_resume", FixtureResume)
FIXTURE_LOAD_CUT: Final = Task(f"{_FIXTURE_TASKS}:fixture_load_cut", FixtureLoadCut)
# Every task a driver or the runner sends, and the ones that load a checkpoint: a scenario that
# ran one of those attempted a load (:meth:`.common.ScenarioContext.load_attempted`).
TASKS: Final = (
    RUNTIME_VERSIONS,
    FIXTURE_IMPORTS,
    TRAIN_AND_SAVE,
    LOAD_AND_STEP,
    DTENSOR_SAVE,
    DTENSOR_LOAD,
    FIXTURE_PROBE,
    FIXTURE_TRAIN,
    FIXTURE_NEVER_SAVES,
    FIXTURE_RESUME,
    FIXTURE_LOAD_CUT,
)
# FIXTURE_LOAD_CUT is not one: it loads a copy outside the store, never a generation.
LOADS: Final = frozenset({LOAD_AND_STEP.ref, DTENSOR_LOAD.ref, FIXTURE_RESUME.ref})
