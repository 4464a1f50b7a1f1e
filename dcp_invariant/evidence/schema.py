"""Schema v2 of the evidence artifact: its file layout and bounds, defined once.

The artifact holds one observation and one result per scenario of the plan
(:mod:`dcp_invariant.plan`), and the verifier refuses any other set of files.
"""

from __future__ import annotations

from dcp_invariant.plan import SCENARIO_NAMES

SCHEMA_VERSION = 2
MAX_FILE_BYTES = 1 << 20  # observations are a few KiB; anything near this is not ours

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
