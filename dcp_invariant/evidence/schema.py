"""The evidence artifact's schema: versions, file layout and bounds, defined once.

The artifact holds one observation and one result per scenario of the plan
(:mod:`dcp_invariant.plan`), and the verifier refuses any other set of files.
"""

from __future__ import annotations

from collections.abc import Sequence

from dcp_invariant.plan import SCENARIO_NAMES, Plan

SCHEMA_VERSION = 2  # the registered suite's artifact
# A fixture run's: per-key state records, the plan in provenance, since 4 the programs its
# groups left running, since 5 the fixture's arguments and rank-local components in the plan,
# what a reshard left out and why a load failed, and since 7 the fingerprints of the app's own
# objects (ranks/app_objects.py). Older ones are refused by name, not guessed at.
FIXTURE_SCHEMA_VERSION = 7
# A run inside the user's torchrun job: a fixture run's records, and the job's launch (nodes,
# processes per node, backend) in the plan; since 8 the app's objects too.
IN_JOB_SCHEMA_VERSION = 8
VERSIONS = (SCHEMA_VERSION, FIXTURE_SCHEMA_VERSION, IN_JOB_SCHEMA_VERSION)
# Versions earlier releases wrote (6: a torchrun job's, 5 and before: a fixture run's).
RETIRED_VERSIONS = (3, 4, 5, 6)
MAX_FILE_BYTES = 1 << 20  # observations are a few KiB; anything near this is not ours
# A fixture run records every key of the user's state at every phase: bounded, but larger.
MAX_FIXTURE_FILE_BYTES = 32 << 20

PROVENANCE_FILE = "provenance.json"
SUMMARY_FILE = "summary.json"
JUNIT_FILE = "junit.xml"
MANIFEST_FILE = "manifest.sha256"


def observation_file(name: str) -> str:
    return f"observations/{name}.json"


def result_file(name: str) -> str:
    return f"results/{name}.json"


def artifact_files(names: Sequence[str]) -> tuple[str, ...]:
    """Every file of an artifact whose plan has scenarios ``names``."""
    return tuple(
        sorted(
            [PROVENANCE_FILE, SUMMARY_FILE, JUNIT_FILE, MANIFEST_FILE]
            + [observation_file(n) for n in names]
            + [result_file(n) for n in names]
        )
    )


def version_for(the_plan: Plan) -> int:
    return {
        "registered": SCHEMA_VERSION,
        "fixture": FIXTURE_SCHEMA_VERSION,
        "in_job": IN_JOB_SCHEMA_VERSION,
    }[the_plan.kind]


def max_file_bytes(the_plan: Plan) -> int:
    return MAX_FILE_BYTES if the_plan.kind == "registered" else MAX_FIXTURE_FILE_BYTES


ARTIFACT_FILES: tuple[str, ...] = artifact_files(SCENARIO_NAMES)
ARTIFACT_DIRS: tuple[str, ...] = ("observations", "results")
