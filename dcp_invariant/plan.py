"""The scenario plan: what every scenario does, defined once (standard library only).

Drivers and workers carry the plan out, the rules hold observations to it, and the verifier
reads it again: none of them has a constant of its own. A plan is a value, so it can be
recorded beside the evidence and checked against what was observed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypedDict, get_args

from dcp_invariant import dcp_layout, fixture_inputs, runtimes
from dcp_invariant.errors import PlanError

Family = Literal[
    "training",
    "dtensor",
    "elastic",
    "rank_exit",
    "damaged",
    "resume",
    "reshard",
    "async_resume",
    "half_written",
    "cross_release",
]
# How an async_resume scenario saves: dcp.async_save in thread mode, with the default
# synchronous staging or with DefaultStager's background staging, or in process mode; or, for
# an app that saves itself and declares its save async, the app's own save(), whose future the
# tool waits for only after the next step.
AsyncMode = Literal["thread", "staged", "process", "app"]
# Who writes and reads a fixture's checkpoints: the tool, through ``dcp.save``/``dcp.load`` of
# the app's ``state_dict()``, or the app itself, through its own ``save(dir)``/``load(dir)``
# (its framework's checkpoint code: ``fabric.save``, ``accelerator.save_state``, ...).
Checkpointing = Literal["dcp", "app"]
CHECKPOINTINGS: tuple[Checkpointing, ...] = get_args(Checkpointing)


class AppShape(TypedDict):
    """Who checkpoints a fixture's app, and what an app that saves itself has and declares.

    The probe finds it (in a torchrun job, every rank builds the app once), the plan's
    scenarios follow from it (:meth:`Plan.checkpointed_by`), and every rank holds the app it
    builds to it. The declarations are the app's own attributes, read only where it saves
    itself: the tool reshards and saves asynchronously what goes through DCP, and cannot know
    whether a framework's own checkpoint code does either.
    """

    checkpointing: Checkpointing
    has_state: bool  # a state_dict() the tool compares, key by key, with what load() restored
    reshards: bool  # ``reshards = True``: its load() restores a save made at another world size
    saves_async: bool  # ``saves_async = True``: its save() returns a future (``result()``)


DCP_SHAPE: AppShape = {
    "checkpointing": "dcp",
    "has_state": True,
    "reshards": False,
    "saves_async": False,
}


def own_shape(
    *, has_state: bool = True, reshards: bool = False, saves_async: bool = False
) -> AppShape:
    """The shape of an app that saves itself."""
    return {
        "checkpointing": "app",
        "has_state": has_state,
        "reshards": reshards,
        "saves_async": saves_async,
    }


# What each declaration is called on the app, and what it makes the tool check.
DECLARATIONS: dict[str, str] = {
    "reshards": "its load() restores a save made at another world size",
    "saves_async": "its save() returns a future that completes with the write",
}


def described(shape: AppShape) -> str:
    """``shape`` in words, for a message that two apps differ."""
    if shape["checkpointing"] == "dcp":
        return "saved by the tool through DCP"
    parts = ["a state_dict()" if shape["has_state"] else "no state_dict()"]
    parts += [f"reshards = {shape['reshards']}", f"saves_async = {shape['saves_async']}"]
    return "saving itself, with " + ", ".join(parts)


# How a note says a declaration was acted on, and what was not checked without it.
_CLAIMED: dict[str, tuple[str, str]] = {
    "reshards": ("resharded between world sizes", "reshard"),
    "saves_async": ("its save() left running through the next step", "async save"),
}
FAMILIES: tuple[Family, ...] = get_args(Family)

# Training scenarios: the fixture takes this many steps, is saved, and (where the plan says so)
# takes one more step as the uninterrupted reference.
STEPS_BEFORE_SAVE = 3
# The DTensor scenarios save one tensor under this label.
DTENSOR_LABEL = "dtensor"

# The rank that dies, and the exit codes it dies with: in the middle of a save (rank_exit) and
# in torchrun's first attempt (elastic).
DYING_RANK = 1
RANK_EXIT_CODE = 86
ELASTIC_EXIT_CODE = 91
# A worker whose task raises exits 1 (``run`` in dcp_invariant/suite/worker.py): what the rank
# that outlives a peer dying mid-save does when DCP's collective save fails under it.
SURVIVOR_EXIT_CODE = 1

# The torchrun job of the elastic scenario: one node, two ranks, one restart, loopback only.
ELASTIC_ARGUMENTS: tuple[str, ...] = (
    "--standalone",
    "--local-addr=127.0.0.1",
    "--nnodes=1",
    "--nproc-per-node=2",
    "--max-restarts=1",
)
ELASTIC_RANK_MODULE = "dcp_invariant.suite.torchrun.elastic_rank"
ELASTIC_PAYLOAD_FILE = "torchrun-payload.json"
TORCHRUN_ARGUMENTS: tuple[str, ...] = (
    *ELASTIC_ARGUMENTS,
    "--monitor-interval=0.1",
    "--module",
    ELASTIC_RANK_MODULE,
    ELASTIC_PAYLOAD_FILE,
)

REGISTERED_FIXTURE = "dcp_invariant.suite.registered_fixture:registered_fixture"

# Why a directory does not match its receipt, file by file: the commit protocol raises these and
# observations record them.
FailureReason = Literal["missing", "size", "digest", "unexpected", "not a regular file"]
FAILURE_REASONS: tuple[FailureReason, ...] = get_args(FailureReason)

# Why DCP's load failed on a resuming rank. torch's default planner raises on the first key of
# the app's state_dict() that the checkpoint lacks, or whose saved size differs from the app's
# (create_default_local_load_plan in torch/distributed/checkpoint/default_planner.py); DCP then
# raises on every rank, naming each rank's own failure (CheckpointException in
# torch/distributed/checkpoint/api.py). "another rank": this rank's own plan was fine. "app
# load": an app that saves itself raised in its own load(). "unreadable metadata": this torch
# cannot read the checkpoint's .metadata (another release wrote it).
LoadFailure = Literal[
    "missing key", "size mismatch", "another rank", "error", "app load", "unreadable metadata"
]
LOAD_FAILURES: tuple[LoadFailure, ...] = get_args(LoadFailure)

# The app's methods the tool calls, and the fixture function that builds it: what raised, when
# the user's own code did (any BaseException but the tool's own interrupt: torch's
# CheckpointException derives from BaseException, torch/distributed/checkpoint/api.py).
AppMethod = Literal["fixture", "save", "load", "state_dict", "load_state_dict", "step"]
APP_METHODS: tuple[AppMethod, ...] = get_args(AppMethod)

DamageKind = Literal["remove", "flip"]


@dataclass(frozen=True)
class Damage:
    """What a damage scenario does to a sealed candidate, and the refusal promotion must give."""

    kind: DamageKind
    target_suffix: str  # the damaged file's name ends with this
    refusal: FailureReason  # the receipt check's reason for that file


@dataclass(frozen=True)
class DTensorPlan:
    """Seven rows over two ranks shard as 4 and 3, so resharding is uneven too."""

    shape: tuple[int, ...] = (7, 3)
    placement: str = "Shard(0)"
    dtype: str = "torch.float64"


DTENSOR = DTensorPlan()


@dataclass(frozen=True)
class Scenario:
    name: str
    family: Family
    source_world_size: int
    target_world_size: int
    summary: str
    damage: Damage | None = None
    async_mode: AsyncMode | None = None
    # Who saves and loads (an app may save itself), and whether its state is compared: the
    # rules name the cause by them (dcp_invariant/evidence/diagnosis.py).
    checkpointing: Checkpointing = "dcp"
    compares_state: bool = True
    # A cross_release scenario: the release whose fresh ranks load the checkpoint the installed
    # torch saved (``run --resume-with-torch``).
    loading_release: str | None = None


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("training_1_to_1", "training", 1, 1, "train on 1 rank, resume on 1 fresh rank"),
    Scenario("training_1_to_2", "training", 1, 2, "train on 1 rank, resume resharded on 2"),
    Scenario("training_2_to_1", "training", 2, 1, "train on 2 ranks, resume resharded on 1"),
    Scenario("training_2_to_2", "training", 2, 2, "train on 2 ranks, resume on 2 fresh ranks"),
    Scenario("dtensor_1_to_2", "dtensor", 1, 2, "DTensor Shard(0) saved on 1 rank, loaded on 2"),
    Scenario("dtensor_2_to_1", "dtensor", 2, 1, "DTensor Shard(0) saved on 2 ranks, loaded on 1"),
    Scenario(
        "elastic_restart_2_to_2",
        "elastic",
        2,
        2,
        f"torchrun restarts a 2-rank job after a rank exits {ELASTIC_EXIT_CODE}; "
        "it resumes the committed generation",
    ),
    Scenario(
        "rank_exit_no_promotion",
        "rank_exit",
        2,
        2,
        "a rank dies in the middle of a save; the candidate is never promoted",
    ),
    Scenario(
        "missing_metadata",
        "damaged",
        2,
        2,
        f"a sealed candidate loses {dcp_layout.METADATA_FILE}; promotion refuses it",
        Damage("remove", dcp_layout.METADATA_FILE, "missing"),
    ),
    Scenario(
        "missing_shard",
        "damaged",
        2,
        2,
        f"a sealed candidate loses a {dcp_layout.SHARD_SUFFIX} shard; promotion refuses it",
        Damage("remove", dcp_layout.SHARD_SUFFIX, "missing"),
    ),
    Scenario(
        "corrupt_shard",
        "damaged",
        2,
        2,
        "one byte of a sealed shard is flipped; promotion refuses it",
        Damage("flip", dcp_layout.SHARD_SUFFIX, "digest"),
    ),
)
SCENARIO_NAMES: tuple[str, ...] = tuple(s.name for s in SCENARIOS)
BY_NAME: dict[str, Scenario] = {s.name: s for s in SCENARIOS}


ELASTIC_SCENARIO = BY_NAME["elastic_restart_2_to_2"]

# A fixture run: the user's own training loop at each world size, and between every two.
DEFAULT_WORLD_SIZES = (1, 2)
DEFAULT_STEPS_BEFORE = 3
DEFAULT_STEPS_AFTER = 3
MAX_WORLD_SIZE = 8
MAX_STEPS = 1000
# Where only generators differ after a resume's K steps, every step matching, both arms run on
# to this many times K steps (at most MAX_STEPS): a generator no step drew from fails only if
# a later draw shows it in a loss or a state key (docs/diagnoses.md).
FURTHER_FACTOR = 4


def further_steps(steps_after: int) -> int:
    """How many resumed steps the arms run on to where only generators differ at the end."""
    return min(FURTHER_FACTOR * steps_after, MAX_STEPS)


# Seconds each worker group may take; a day at most: longer is a typo, and far longer overflows
# the timers it reaches (1e308 did).
DEFAULT_TIMEOUT = 180.0
# `preempt`: crash points relaunched, and seconds each launch of the user's command may take
# (a real job's run, so far above a worker group's).
PREEMPT_CRASH_POINTS = 32
PREEMPT_TIMEOUT = 600.0
# SIGTERM points (each a launch of its own) and the seconds between SIGTERM and SIGKILL: 30 is
# Kubernetes' default terminationGracePeriodSeconds.
PREEMPT_SIGTERM_POINTS = 3
PREEMPT_GRACE = 30.0
MAX_TIMEOUT = 86400.0
# "in_job": the user's own torchrun job runs the checks at its world size, across nodes
# (dcp_invariant/suite/torchrun/in_job.py).
PlanKind = Literal["registered", "fixture", "in_job"]
Backend = Literal["gloo", "nccl"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)
# A torchrun job's world size: nodes times processes per node. Far beyond any one host's 8.
MAX_IN_JOB_WORLD_SIZE = 65536


@dataclass(frozen=True)
class Plan:
    """Which scenarios run, on which fixture, with how many steps before and after the save."""

    kind: PlanKind
    fixture: str
    world_sizes: tuple[int, ...]
    steps_before: int
    steps_after: int
    scenarios: tuple[Scenario, ...]
    # Keyword arguments of the fixture, sorted by name; values are JSON (lists and objects are
    # not hashable, so the plan hashes without them; equality still compares them).
    fixture_args: tuple[tuple[str, Any], ...] = field(default=(), hash=False)
    # Components declared per rank: resharding leaves them out (resumes still check them).
    rank_local: tuple[str, ...] = ()
    # An in-job plan: how torchrun launched the job the checks ran in.
    launch: Launch | None = None
    checkpointing: Checkpointing = "dcp"
    # False for an app that saves itself and has no state_dict(): its resumes are judged by
    # their losses and the app's own objects, as its note says (:attr:`notes`).
    compares_state: bool = True
    # What an app that saves itself declares (AppShape): it is resharded, saved asynchronously.
    reshards: bool = False
    saves_async: bool = False
    # Attributes of the app's objects (or global RNGs) the user declares irrelevant: left out of
    # what the ranks record of them (``--ignore-attr``; dcp_invariant/evidence/object_causes.py).
    ignored_attrs: tuple[str, ...] = ()
    # ``--resume-with-torch``: the releases that load what the installed one (``torch_release``)
    # saved, each in scenarios of its own (cross_release).
    resume_with_torch: tuple[str, ...] = ()
    torch_release: str = ""

    @property
    def arguments(self) -> dict[str, Any]:
        return dict(self.fixture_args)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.scenarios)

    def scenario(self, name: str) -> Scenario:
        for scenario in self.scenarios:
            if scenario.name == name:
                return scenario
        raise KeyError(name)

    def arms_home(self, name: str) -> str | None:
        """The scenario whose observation holds ``name``'s ``never_saves`` and ``repeat`` arms,
        where that is another: in a fixture run, ``resume_<w>`` for an ``async_resume`` at w,
        which the pool runs the same two arms for (dcp_invariant/evidence/shared_arms.py). None
        for every other scenario, and in a job."""
        scenario = self.scenario(name)
        home = f"resume_{scenario.source_world_size}"
        # Only the pool shares groups: in a job every scenario runs its own arms (and keeps them).
        if self.kind == "fixture" and scenario.family == "async_resume" and home in self.names:
            return home
        return None

    @property
    def baseline_label(self) -> str:
        return f"step-{self.steps_before}"

    @property
    def candidate_label(self) -> str:
        """The save one step after the baseline, which the damage and crash scenarios act on."""
        return f"step-{self.steps_before + 1}"

    @property
    def baseline_then_candidate(self) -> list[tuple[str, int]]:
        """``(label, after_steps)`` of the two saves: the baseline is promoted, the candidate is
        what the scenario acts on."""
        return [
            (self.baseline_label, self.steps_before),
            (self.candidate_label, self.steps_before + 1),
        ]

    @property
    def shape(self) -> AppShape:
        return {
            "checkpointing": self.checkpointing,
            "has_state": self.compares_state,
            "reshards": self.reshards,
            "saves_async": self.saves_async,
        }

    def checkpointed_by(self, shape: AppShape) -> Plan:
        """This fixture plan for an app of ``shape``: its own scenarios (:func:`fixture_plan`).

        PlanError where the parameters do not fit it (rank-local components of an app that
        saves itself and is not resharded, say).
        """
        if shape == self.shape:
            return self
        if self.kind == "in_job":
            assert self.launch is not None  # every in-job plan has its launch
            return in_job_plan(
                self.fixture,
                self.launch,
                self.steps_before,
                self.steps_after,
                self.arguments,
                shape,
                ignored_attrs=self.ignored_attrs,
            )
        return fixture_plan(
            self.fixture,
            self.world_sizes,
            self.steps_before,
            self.steps_after,
            self.arguments,
            self.rank_local,
            shape,
            ignored_attrs=self.ignored_attrs,
            resume_with_torch=self.resume_with_torch,
            torch_release=self.torch_release,
        )

    @property
    def notes(self) -> tuple[str, ...]:
        """What a run of this plan did not check, for the console to say: an app that saves
        itself may not have meant its save() and load() for the tool, and declares what its
        framework does beyond a resume at one world size."""
        if self.checkpointing == "dcp":
            return ()
        claims = [
            f"{_CLAIMED[name][0]}, as it declares ({name} = True)"
            if getattr(self, name)
            else f"no {_CLAIMED[name][1]} checked: set {name} = True on the app if "
            f"{DECLARATIONS[name]}"
            for name in DECLARATIONS
        ]
        notes = [
            f"{self.fixture}'s app has its own save() and load(): the tool ran them instead of "
            "DCP, at each world size and across torchrun's restart; " + "; ".join(claims)
        ]
        if not self.compares_state:
            notes.append(
                f"{self.fixture}'s app has no state_dict(): each resume is judged by its losses "
                "and by the app's own objects; give it a state_dict() to have what its load() "
                "restored compared key by key"
            )
        return tuple(notes)

    def to_record(self) -> dict[str, Any]:
        """What provenance records of a fixture run; :func:`plan_from_record` reads it back."""
        launch = {} if self.launch is None else {"launch": self.launch.to_record()}
        # Recorded only when the app saves itself: a DCP run's plan, and so its evidence, reads
        # as it did before apps could.
        own = {k: v for k, v in OWN_CHECKPOINTING.items() if getattr(self, k) == v}
        # Recorded only when given, as the app's checkpointing is.
        ignored = {"ignored_attrs": list(self.ignored_attrs)} if self.ignored_attrs else {}
        releases = (
            {"resume_with_torch": list(self.resume_with_torch), "torch_release": self.torch_release}
            if self.resume_with_torch
            else {}
        )
        return {
            **launch,
            **own,
            **ignored,
            **releases,
            "fixture": self.fixture,
            "fixture_args": self.arguments,
            "kind": self.kind,
            "rank_local": list(self.rank_local),
            "scenarios": list(self.names),
            "steps_after": self.steps_after,
            "steps_before": self.steps_before,
            "world_sizes": list(self.world_sizes),
        }


@dataclass(frozen=True)
class Launch:
    """The torchrun job an in-job run happened in: no host names, addresses or ports."""

    nodes: int
    nproc_per_node: int
    backend: Backend
    # A second launch at another world size resumes the first launch's checkpoint, saved at
    # this world size; None: the launch checks its own saves.
    resumed_from: int | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    def to_record(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "nodes": self.nodes,
            "nproc_per_node": self.nproc_per_node,
            "resumed_from": self.resumed_from,
        }


REGISTERED = Plan("registered", REGISTERED_FIXTURE, (1, 2), STEPS_BEFORE_SAVE, 1, SCENARIOS)


def in_job_plan(
    fixture: str,
    launch: Launch,
    steps_before: int = DEFAULT_STEPS_BEFORE,
    steps_after: int = DEFAULT_STEPS_AFTER,
    fixture_args: Mapping[str, Any] | None = None,
    shape: AppShape = DCP_SHAPE,
    *,
    ignored_attrs: Sequence[str] = (),
) -> Plan:
    """The checks a torchrun job runs on itself at its own world size W: resume_W (dcp.save)
    and async_resume_W (dcp.async_save, thread mode), each across torchrun's restart of every
    worker on every node. An app that saves itself: resume_W through its own save and load,
    async_resume_W where it declares its save async, and a second launch only where it
    declares that it reshards."""
    fixture_inputs.check_fixture_spec(fixture)
    if (
        not fixture_inputs.positive_int(launch.nodes)
        or not fixture_inputs.positive_int(launch.nproc_per_node)
        or launch.world_size > MAX_IN_JOB_WORLD_SIZE
    ):
        raise PlanError(
            f"{launch.nodes} node(s) of {launch.nproc_per_node} process(es): give positive "
            f"integers, at most {MAX_IN_JOB_WORLD_SIZE} processes in all"
        )
    if launch.backend not in BACKENDS:
        raise PlanError(f"backend {launch.backend!r}: give one of {list(BACKENDS)}")
    a = launch.resumed_from
    if a is not None and (
        not fixture_inputs.positive_int(a) or a > MAX_IN_JOB_WORLD_SIZE or a == launch.world_size
    ):
        raise PlanError(
            f"resumed from world size {a!r}: give the first launch's world size, another than "
            f"this launch's {launch.world_size} (a resume at the same size is the first launch's)"
        )
    _check_steps(steps_before, steps_after)
    _check_shape(shape)
    w, n = launch.world_size, steps_before
    arguments = fixture_inputs.fixture_args({} if fixture_args is None else fixture_args)
    ignored = fixture_inputs.ignored_attrs(ignored_attrs)
    if shape["checkpointing"] == "app":
        if a is not None and not shape["reshards"]:
            raise PlanError(
                "--resume-from: this app saves itself and does not declare reshards = True, so "
                "a load at another world size is not its framework's to promise; check it at "
                "each world size with a launch of its own, or declare it if its load() reshards"
            )
        own: list[Scenario] = []
        if a is not None:
            own.append(
                Scenario(
                    f"reshard_{a}_to_{w}",
                    "reshard",
                    a,
                    w,
                    f"in a second torchrun job: the first job's step-{n} save, made at {a} ranks "
                    f"by the app's save(), loaded at {w} by its load(): every key bit-identical, "
                    f"then {steps_after} steps",
                )
            )
        else:
            own.append(
                Scenario(
                    f"resume_{w}",
                    "resume",
                    w,
                    w,
                    f"in the torchrun job: {n}+{steps_after} steps on {w} ranks, twice; every "
                    f"worker restarted loads step {n} with the app's own load() and matches the "
                    f"last {steps_after}",
                )
            )
            if shape["saves_async"]:
                own.append(_own_async(w, n, "in the torchrun job: "))
        return Plan(
            "in_job",
            fixture,
            (w,),
            n,
            steps_after,
            _checkpointed_by_app(own, shape),
            arguments,
            (),
            launch,
            **_plan_fields(shape),
            ignored_attrs=ignored,
        )
    if a is not None:
        resharded = Scenario(
            f"reshard_{a}_to_{w}",
            "reshard",
            a,
            w,
            f"in a second torchrun job: the first job's step-{n} checkpoint, saved at {a} ranks, "
            f"loaded at {w}: every key bit-identical, then {steps_after} steps",
        )
        return Plan(
            "in_job",
            fixture,
            (w,),
            n,
            steps_after,
            (resharded,),
            arguments,
            (),
            launch,
            ignored_attrs=ignored,
        )
    scenarios = (
        Scenario(
            f"resume_{w}",
            "resume",
            w,
            w,
            f"in the torchrun job: {n}+{steps_after} steps on {w} ranks, twice; every worker "
            f"restarted loads step {n} and matches the last {steps_after}",
        ),
        Scenario(
            f"async_resume_{w}",
            "async_resume",
            w,
            w,
            f"in the torchrun job: dcp.async_save at step {n} while step {n + 1} runs; the "
            f"restarted workers load step {n}",
            async_mode="thread",
        ),
    )
    return Plan(
        "in_job",
        fixture,
        (w,),
        n,
        steps_after,
        scenarios,
        arguments,
        (),
        launch,
        ignored_attrs=ignored,
    )


def fixture_plan(
    fixture: str,
    world_sizes: tuple[int, ...] = DEFAULT_WORLD_SIZES,
    steps_before: int = DEFAULT_STEPS_BEFORE,
    steps_after: int = DEFAULT_STEPS_AFTER,
    fixture_args: Mapping[str, Any] | None = None,
    rank_local: Sequence[str] = (),
    shape: AppShape = DCP_SHAPE,
    *,
    ignored_attrs: Sequence[str] = (),
    resume_with_torch: Sequence[str] = (),
    torch_release: str = "",
) -> Plan:
    """The scenarios of a fixture run, derived from its parameters; PlanError outside the grammar.

    An app that saves itself (``shape``) is resumed at each world size, across torchrun's
    restart, and from a save cut short; it is resharded, or saved asynchronously, where it
    declares that its framework does so (:class:`AppShape`): what its framework writes is its
    own, so the tool cannot reshard it or make its save asynchronous.
    """
    fixture_inputs.check_fixture_spec(fixture)
    sizes = tuple(world_sizes)
    if (
        not sizes
        or not all(fixture_inputs.positive_int(w) and w <= MAX_WORLD_SIZE for w in sizes)
        or len(set(sizes)) != len(sizes)
    ):
        raise PlanError(
            f"world sizes {fixture_inputs.shown_value(list(sizes), 200)}: give distinct "
            f"integers from 1 to {MAX_WORLD_SIZE}, e.g. 1,2"
        )
    _check_steps(steps_before, steps_after)
    sizes = tuple(sorted(sizes))
    n, k = steps_before, steps_after
    arguments = fixture_inputs.fixture_args({} if fixture_args is None else fixture_args)
    local = fixture_inputs.rank_local(rank_local)
    ignored = fixture_inputs.ignored_attrs(ignored_attrs)
    releases = _other_releases(resume_with_torch, torch_release)
    across = [
        Scenario(
            cross_release_name(torch_release, b, w),
            "cross_release",
            w,
            w,
            f"saved at step {n} on {w} rank(s) by torch {torch_release}, loaded by fresh ranks "
            f"running torch {b}: every key bit-identical, {k} steps as on {b}",
            loading_release=b,
        )
        for b in releases
        for w in sizes
    ]
    installed = torch_release if releases else ""
    scenarios = [
        Scenario(
            f"resume_{w}",
            "resume",
            w,
            w,
            f"{n}+{k} steps on {w} rank(s); fresh ranks load step {n} and match the last {k}",
        )
        for w in sizes
    ]
    _check_shape(shape)
    reshards = [
        Scenario(
            f"reshard_{a}_to_{b}",
            "reshard",
            a,
            b,
            f"saved at step {n} on {a} rank(s), loaded on {b}: every key bit-identical",
        )
        for a in sizes
        for b in sizes
        if a != b
    ]
    if shape["checkpointing"] == "app":
        if releases and not shape["has_state"]:
            # The other release's resumes are held to each other, never to A's steps: without a
            # state_dict() a load() on B that restores nothing would pass.
            raise PlanError(
                f"--resume-with-torch {releases[0]}: {fixture}'s app saves itself and has no "
                "state_dict(), so what its load() restores on another torch release cannot be "
                "compared with what it saved; give the app a state_dict(), or drop "
                "--resume-with-torch"
            )
        if local and not shape["reshards"]:
            raise PlanError(
                f"--rank-local {local[0]}: this app saves itself and does not declare "
                "reshards = True, so it is never loaded at another world size and nothing is "
                "left out of a load; drop --rank-local"
            )
        if shape["reshards"]:
            scenarios += [
                replace(
                    s,
                    summary=f"saved at step {n} on {s.source_world_size} rank(s) by the app's "
                    f"save(), loaded on {s.target_world_size} by its load(): every key "
                    "bit-identical",
                )
                for s in reshards
            ]
        if shape["saves_async"]:
            scenarios += [_own_async(w, n) for w in sizes]
        if 2 in sizes:
            scenarios.append(ELASTIC_SCENARIO)
        # At the largest world size, where a save writes the most to cut short.
        scenarios.append(
            Scenario(
                f"half_written_{sizes[-1]}",
                "half_written",
                sizes[-1],
                sizes[-1],
                f"the save at step {n} on {sizes[-1]} rank(s), cut short: fresh ranks' load() "
                "must refuse it",
            )
        )
        for i, scenario in enumerate(scenarios):
            if scenario.family == "resume":
                scenarios[i] = replace(
                    scenario,
                    summary=f"{n}+{k} steps on {scenario.source_world_size} rank(s); fresh ranks "
                    f"load step {n} with the app's own load() and match the last {k}",
                )
        return Plan(
            "fixture",
            fixture,
            sizes,
            n,
            k,
            _checkpointed_by_app([*scenarios, *across], shape),
            arguments,
            local,
            **_plan_fields(shape),
            ignored_attrs=ignored,
            resume_with_torch=releases,
            torch_release=installed,
        )
    scenarios += reshards
    scenarios += [
        Scenario(
            f"async_resume_{w}",
            "async_resume",
            w,
            w,
            f"dcp.async_save at step {n} while step {n + 1} runs; the checkpoint holds step {n}",
            async_mode="thread",
        )
        for w in sizes
    ]
    # Background staging (DefaultStager) at the largest world size: one is enough to show it.
    scenarios.append(
        Scenario(
            f"async_staged_resume_{sizes[-1]}",
            "async_resume",
            sizes[-1],
            sizes[-1],
            f"async_save with background staging; step {n + 1} waits for the staging only",
            async_mode="staged",
        )
    )
    # Process mode at the smallest world size: each rank starts a checkpoint process of its own.
    scenarios.append(
        Scenario(
            f"async_process_resume_{sizes[0]}",
            "async_resume",
            sizes[0],
            sizes[0],
            f"async_save in process mode: a checkpoint process writes step {n} while step "
            f"{n + 1} runs",
            async_mode="process",
        )
    )
    if 2 in sizes:
        scenarios.append(ELASTIC_SCENARIO)
    return Plan(
        "fixture",
        fixture,
        sizes,
        n,
        k,
        (*scenarios, *across),
        arguments,
        local,
        ignored_attrs=ignored,
        resume_with_torch=releases,
        torch_release=installed,
    )


def cross_release_name(saved_by: str, loaded_by: str, world_size: int) -> str:
    """``upgrade_<A>_to_<B>_<w>``, or ``downgrade_...`` where B is the older release."""
    way = (
        "upgrade"
        if runtimes.release_key(loaded_by) > runtimes.release_key(saved_by)
        else "downgrade"
    )
    return f"{way}_{saved_by}_to_{loaded_by}_{world_size}"


def _other_releases(given: Sequence[str], installed: str) -> tuple[str, ...]:
    """``--resume-with-torch``'s releases, each registered and other than the installed one,
    oldest first."""
    if isinstance(given, str) or not all(isinstance(r, str) for r in given):
        raise PlanError("--resume-with-torch: give releases as strings, e.g. 2.15.0")
    registered = runtimes.releases()
    for release in given:
        if release not in registered:
            raise PlanError(
                f"--resume-with-torch {fixture_inputs.shown_value(release, 40)}: not a registered "
                f"release; give one of {', '.join(registered)}"
            )
        if list(given).count(release) > 1:
            raise PlanError(f"--resume-with-torch {release}: given twice; give each release once")
    if given and installed not in registered:
        other = next((r for r in reversed(registered) if r not in given), registered[-1])
        raise PlanError(
            "--resume-with-torch: the installed torch is not a registered release (or none is "
            f"installed), and it saves what the other release loads: install one, e.g. "
            f"{runtimes.install_command(other)}"
        )
    for release in given:
        if release == installed:
            raise PlanError(
                f"--resume-with-torch {release}: that is the installed torch, whose resumes the "
                "resume scenarios check; give another registered release"
            )
    return tuple(sorted(given, key=runtimes.release_key))


def _own_async(w: int, n: int, where: str = "") -> Scenario:
    return Scenario(
        f"async_resume_{w}",
        "async_resume",
        w,
        w,
        f"{where}the app's save() at step {n} returns a future; step {n + 1} runs before the "
        f"tool waits for it, and the checkpoint holds step {n}",
        async_mode="app",
    )


def _checkpointed_by_app(scenarios: Sequence[Scenario], shape: AppShape) -> tuple[Scenario, ...]:
    return tuple(
        replace(s, checkpointing="app", compares_state=shape["has_state"]) for s in scenarios
    )


def _plan_fields(shape: AppShape) -> dict[str, Any]:
    return {
        "checkpointing": shape["checkpointing"],
        "compares_state": shape["has_state"],
        "reshards": shape["reshards"],
        "saves_async": shape["saves_async"],
    }


def _check_shape(shape: Any) -> None:
    """``shape`` is an :class:`AppShape`: a DCP app's declarations are never read, and an app
    that declares it reshards has a state_dict() to compare (a reshard's steps are not compared
    with the run at the source's world size, so without one nothing would be checked)."""
    if not isinstance(shape, dict) or set(shape) != set(AppShape.__annotations__):
        raise PlanError(
            f"app shape {shape!r}: expected the keys {sorted(AppShape.__annotations__)}"
        )
    if shape["checkpointing"] not in CHECKPOINTINGS:
        raise PlanError(
            f"checkpointing {shape['checkpointing']!r}: give one of {list(CHECKPOINTINGS)}"
        )
    for key in ("has_state", "reshards", "saves_async"):
        if not isinstance(shape[key], bool):
            raise PlanError(f"{key} {shape[key]!r}: expected true or false")
    if shape["checkpointing"] == "dcp" and shape != DCP_SHAPE:
        raise PlanError(
            "an app checkpointed through DCP has a state_dict() and declares nothing: only an "
            "app that saves itself may have no state, reshard or save asynchronously"
        )
    if shape["reshards"] and not shape["has_state"]:
        raise PlanError(
            "the app declares reshards = True but has no state_dict(): what its load() restores "
            "at another world size can only be checked key by key; give it a state_dict()"
        )


def _check_steps(steps_before: Any, steps_after: Any) -> None:
    for what, steps in (("steps before the save", steps_before), ("steps after", steps_after)):
        if not fixture_inputs.positive_int(steps) or steps > MAX_STEPS:
            raise PlanError(
                f"{what}: {fixture_inputs.shown_value(steps)}, expected an integer from 1 to "
                f"{MAX_STEPS}"
            )


def plan_from_record(record: Any) -> Plan:
    """Read a recorded fixture plan back, holding it to the grammar and its own scenario list."""
    if isinstance(record, dict) and record.get("kind") == "in_job":
        return _in_job_plan_from_record(record)
    keys = {
        "fixture",
        "fixture_args",
        "kind",
        "rank_local",
        "scenarios",
        "steps_after",
        "steps_before",
        "world_sizes",
    }
    if not isinstance(record, dict) or set(record) - _OPTIONAL_KEYS != keys:
        raise PlanError(
            f"plan: expected exactly the keys {sorted(keys)} (and {', '.join(sorted(_OPTIONAL_KEYS))})"
        )
    shape = _recorded_shape(record)
    if record["kind"] != "fixture":
        raise PlanError(f"plan: kind {record['kind']!r}, expected 'fixture'")
    sizes = record["world_sizes"]
    if not isinstance(sizes, list) or sizes != sorted(sizes):
        raise PlanError("plan: world_sizes must be a sorted list")
    local = record["rank_local"]
    if not isinstance(local, list) or local != sorted(local):
        raise PlanError("plan: rank_local must be a sorted list")
    if not isinstance(record["fixture_args"], dict):
        raise PlanError("plan: fixture_args must be an object")
    derived = fixture_plan(
        record["fixture"],
        tuple(sizes),
        record["steps_before"],
        record["steps_after"],
        record["fixture_args"],
        local,
        shape,
        ignored_attrs=_recorded_ignored(record),
        **_recorded_releases(record),
    )
    if record.get("resume_with_torch", []) != list(derived.resume_with_torch):
        raise PlanError("plan: resume_with_torch must be sorted oldest first")
    if record["scenarios"] != list(derived.names):
        raise PlanError(
            f"plan: scenarios {record['scenarios']!r} are not the ones its parameters give, "
            f"{list(derived.names)}"
        )
    return derived


# A recorded plan's keys for an app that saves itself (Plan's fields), and their values then:
# absent for a DCP run (Plan.to_record writes them only when they say something).
OWN_CHECKPOINTING: dict[str, Any] = {
    "checkpointing": "app",
    "compares_state": False,
    "reshards": True,
    "saves_async": True,
}


# A run with --resume-with-torch records both; any other, neither.
_RELEASE_KEYS = ("resume_with_torch", "torch_release")


def _recorded_releases(record: dict[str, Any]) -> dict[str, Any]:
    present = [k for k in _RELEASE_KEYS if k in record]
    if not present:
        return {}
    releases, installed = record.get("resume_with_torch"), record.get("torch_release")
    if (
        len(present) != len(_RELEASE_KEYS)
        or not isinstance(releases, list)
        or not releases
        or not isinstance(installed, str)
    ):
        raise PlanError(
            "plan: resume_with_torch (a non-empty list) and torch_release (a string) go together"
        )
    # fixture_plan() holds each release to the registry; the scenario list, to its order.
    return {"resume_with_torch": tuple(releases), "torch_release": installed}


# Keys a recorded plan has only when they say something.
_OPTIONAL_KEYS = frozenset({*OWN_CHECKPOINTING, "ignored_attrs", *_RELEASE_KEYS})


def _recorded_ignored(record: dict[str, Any]) -> tuple[str, ...]:
    if "ignored_attrs" not in record:
        return ()
    paths = record["ignored_attrs"]
    if not isinstance(paths, list) or not paths or paths != sorted(paths):
        raise PlanError("plan: ignored_attrs must be a non-empty sorted list, or no key")
    return fixture_inputs.ignored_attrs(paths)


def _recorded_shape(record: dict[str, Any]) -> AppShape:
    for key, value in OWN_CHECKPOINTING.items():
        if key in record and (type(record[key]) is not type(value) or record[key] != value):
            raise PlanError(f"plan: {key} {record[key]!r}, expected {value!r} or no key")
    shape: AppShape = {
        "checkpointing": record.get("checkpointing", "dcp"),
        "has_state": record.get("compares_state", True),
        "reshards": record.get("reshards", False),
        "saves_async": record.get("saves_async", False),
    }
    _check_shape(shape)
    return shape


def _in_job_plan_from_record(record: dict[str, Any]) -> Plan:
    keys = {
        "fixture",
        "fixture_args",
        "kind",
        "launch",
        "rank_local",
        "scenarios",
        "steps_after",
        "steps_before",
        "world_sizes",
    }
    if set(record) - _OPTIONAL_KEYS != keys:
        raise PlanError(
            f"plan: expected exactly the keys {sorted(keys)} (and {', '.join(sorted(_OPTIONAL_KEYS))})"
        )
    shape = _recorded_shape(record)
    launch = record["launch"]
    if not isinstance(launch, dict) or set(launch) != {
        "backend",
        "nodes",
        "nproc_per_node",
        "resumed_from",
    }:
        raise PlanError(
            "plan: launch must hold exactly backend, nodes, nproc_per_node and resumed_from"
        )
    if not isinstance(record["fixture_args"], dict):
        raise PlanError("plan: fixture_args must be an object")
    derived = in_job_plan(
        record["fixture"],
        Launch(
            launch["nodes"], launch["nproc_per_node"], launch["backend"], launch["resumed_from"]
        ),
        record["steps_before"],
        record["steps_after"],
        record["fixture_args"],
        shape,
        ignored_attrs=_recorded_ignored(record),
    )
    for key, value in (
        ("scenarios", list(derived.names)),
        ("world_sizes", list(derived.world_sizes)),
        ("rank_local", []),
    ):
        if record[key] != value:
            raise PlanError(
                f"plan: {key} {record[key]!r} are not the ones its launch gives, {value!r}"
            )
    return derived
