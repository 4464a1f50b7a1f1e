"""The evidence artifact: its files (schema.artifact_files), built from observations and provenance.

Results, summary, JUnit and manifest are all derived here from the observations with the
verifier's own rules, so what the runner writes is exactly what the verifier re-derives.
"""

from __future__ import annotations

from typing import Any

from dcp_invariant import canonical, plan
from dcp_invariant.evidence import junit, manifest, object_causes, rules, schema, shared_arms


def build(
    observations: dict[str, dict[str, Any]],
    provenance: dict[str, Any],
    *,
    run_plan: plan.Plan,
) -> dict[str, bytes]:
    """Every artifact file's bytes, keyed by relative path."""
    if sorted(observations) != sorted(run_plan.names):
        raise ValueError(f"expected observations for {list(run_plan.names)}")
    # As stored: the arms scenarios share in one observation, every digest labelled run-wide.
    stored = shared_arms.recorded_once(observations, run_plan=run_plan)
    object_causes.intern([stored[name] for name in run_plan.names])
    # Judged alone and against each other, as the verifier judges them again.
    results = rules.results(stored, run_plan=run_plan)
    files = derived(results, run_plan=run_plan)
    files[schema.PROVENANCE_FILE] = canonical.dumps(provenance)
    for name, obs in stored.items():
        files[schema.observation_file(name)] = canonical.dumps(obs)
    files[schema.MANIFEST_FILE] = manifest.render(files)
    return files


def derived(results: dict[str, dict[str, Any]], *, run_plan: plan.Plan) -> dict[str, bytes]:
    """The files that follow from the result records alone."""
    files = {schema.result_file(name): canonical.dumps(r) for name, r in results.items()}
    files[schema.SUMMARY_FILE] = canonical.dumps(rules.summary_record(results, run_plan=run_plan))
    files[schema.JUNIT_FILE] = junit.render(results, run_plan=run_plan)
    return files
