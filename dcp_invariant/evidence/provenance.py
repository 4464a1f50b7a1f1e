"""provenance.json: which code and which runtime produced an artifact. Unsigned, and says so."""

from __future__ import annotations

import platform
import re
from typing import Any

from dcp_invariant import __version__, plan
from dcp_invariant.evidence import checks, schema

_HEX40 = re.compile(r"[0-9a-f]{40}")
valid_revision = _HEX40.fullmatch

_FIELDS: dict[str, checks.Check] = {
    "authenticated": checks.one_of(False),
    "cpython": checks.string,
    "numpy": checks.optional(checks.string),
    "source_revision": checks.pattern(_HEX40, "a 40-hex source revision"),
    "tool": checks.string,
    "torch_distribution": checks.string,
    "torch_runtime": checks.string,
}
SHAPE = checks.record(**_FIELDS, schema_version=checks.one_of(schema.SCHEMA_VERSION))
# A fixture run also records its plan; plan.plan_from_record holds it to the grammar.
FIXTURE_SHAPE = checks.record(
    **_FIELDS,
    plan=lambda value, where: [],
    schema_version=checks.one_of(schema.FIXTURE_SCHEMA_VERSION),
)


def shape_problems(record: dict[str, Any]) -> list[str]:
    fixture = record.get("schema_version") == schema.FIXTURE_SCHEMA_VERSION
    return (FIXTURE_SHAPE if fixture else SHAPE)(record, schema.PROVENANCE_FILE)


def recorded_plan(record: dict[str, Any]) -> plan.Plan:
    """The plan an artifact's provenance names; PlanError when it is outside the grammar."""
    if record.get("schema_version") != schema.FIXTURE_SCHEMA_VERSION:
        return plan.REGISTERED
    if "plan" not in record:
        raise plan.PlanError("a fixture run's provenance must record its plan")
    return plan.plan_from_record(record["plan"])


def build(
    *,
    source_revision: str,
    torch_distribution: str,
    torch_runtime: str,
    numpy: str | None,
    run_plan: plan.Plan = plan.REGISTERED,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        # Nothing signs the artifact: the manifest detects damage, not forgery.
        "authenticated": False,
        "cpython": platform.python_version(),
        "numpy": numpy,
        "schema_version": schema.version_for(run_plan),
        "source_revision": source_revision,
        "tool": f"dcp-invariant {__version__}",
        "torch_distribution": torch_distribution,
        "torch_runtime": torch_runtime,
    }
    if run_plan.kind == "fixture":
        record["plan"] = run_plan.to_record()
    return record
