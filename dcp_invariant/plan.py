"""The scenario plan: what every scenario does, defined once (standard library only).

Drivers and workers carry the plan out, the rules hold observations to it, and the verifier
reads it again: none of them has a constant of its own. A plan is a value, so it can be
recorded beside the evidence and checked against what was observed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Family = Literal["training", "dtensor", "elastic", "rank_exit", "damaged"]
FAMILIES: tuple[Family, ...] = get_args(Family)

# DCP's on-disk names (torch/distributed/checkpoint/filesystem.py): FileSystemWriter.finish()
# writes ``.metadata`` last, by rename, so it is DCP's only commit marker; each rank writes
# its data as ``__<rank>_<n>.distcp``.
METADATA_FILE = ".metadata"
SHARD_SUFFIX = ".distcp"

# Training scenarios: the fixture takes this many steps, is saved, and (where the plan says so)
# takes one more step as the uninterrupted reference.
STEPS_BEFORE_SAVE = 3
BASELINE_LABEL = f"step-{STEPS_BEFORE_SAVE}"
CANDIDATE_LABEL = f"step-{STEPS_BEFORE_SAVE + 1}"
# The DTensor scenarios save one tensor under this label.
DTENSOR_LABEL = "dtensor"

# The rank that dies, and the exit codes it dies with: in the middle of a save (rank_exit) and
# in torchrun's first attempt (elastic).
DYING_RANK = 1
RANK_EXIT_CODE = 86
ELASTIC_EXIT_CODE = 91

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
        f"a sealed candidate loses {METADATA_FILE}; promotion refuses it",
        Damage("remove", METADATA_FILE, "missing"),
    ),
    Scenario(
        "missing_shard",
        "damaged",
        2,
        2,
        f"a sealed candidate loses a {SHARD_SUFFIX} shard; promotion refuses it",
        Damage("remove", SHARD_SUFFIX, "missing"),
    ),
    Scenario(
        "corrupt_shard",
        "damaged",
        2,
        2,
        "one byte of a sealed shard is flipped; promotion refuses it",
        Damage("flip", SHARD_SUFFIX, "digest"),
    ),
)
SCENARIO_NAMES: tuple[str, ...] = tuple(s.name for s in SCENARIOS)
BY_NAME: dict[str, Scenario] = {s.name: s for s in SCENARIOS}


def expected_shard_rows(rows: int, world_size: int, rank: int) -> int:
    """Rows of a ``Shard(0)`` DTensor on ``rank``: torch.chunk semantics, ceil-sized, tail short."""
    chunk = -(-rows // world_size)
    return max(0, min(rows, (rank + 1) * chunk) - rank * chunk)
