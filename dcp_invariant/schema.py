"""Schema v2 of the evidence artifact: scenario names, file layout and bounds, defined once.

The scenario names are part of the schema: the artifact holds one observation and one result
per name, and the verifier refuses any other set.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA_VERSION = 2
MAX_FILE_BYTES = 1 << 20  # observations are a few KiB; anything near this is not ours

# The DTensor scenarios' tensor: seven rows over two ranks shard as 4 and 3, so resharding is
# uneven too. Workers build it from these; the rules hold observations to them.
DTENSOR_SHAPE = (7, 3)
DTENSOR_PLACEMENT = "Shard(0)"
DTENSOR_DTYPE = "torch.float64"


@dataclass(frozen=True)
class Scenario:
    name: str
    family: str
    source_world_size: int
    target_world_size: int
    summary: str
    damage: str | None = None


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
        "torchrun restarts a 2-rank job after a rank exits 91; it resumes the committed generation",
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
        "a sealed candidate loses .metadata; promotion refuses it",
        damage="missing_metadata",
    ),
    Scenario(
        "missing_shard",
        "damaged",
        2,
        2,
        "a sealed candidate loses a .distcp shard; promotion refuses it",
        damage="missing_shard",
    ),
    Scenario(
        "corrupt_shard",
        "damaged",
        2,
        2,
        "one byte of a sealed shard is flipped; promotion refuses it",
        damage="corrupt_shard",
    ),
)
SCENARIO_NAMES: tuple[str, ...] = tuple(s.name for s in SCENARIOS)
BY_NAME: dict[str, Scenario] = {s.name: s for s in SCENARIOS}

PROVENANCE_FILE = "provenance.json"
SUMMARY_FILE = "summary.json"
JUNIT_FILE = "junit.xml"
MANIFEST_FILE = "manifest.sha256"


def observation_file(name: str) -> str:
    return f"observations/{name}.json"


def result_file(name: str) -> str:
    return f"results/{name}.json"


ARTIFACT_FILES: tuple[str, ...] = tuple(
    sorted(
        [PROVENANCE_FILE, SUMMARY_FILE, JUNIT_FILE, MANIFEST_FILE]
        + [observation_file(n) for n in SCENARIO_NAMES]
        + [result_file(n) for n in SCENARIO_NAMES]
    )
)
ARTIFACT_DIRS: tuple[str, ...] = ("observations", "results")
