"""The offline verifier: re-derives every verdict from the observations and checks every byte.

Imports the standard library and the package's pure modules only, never torch or a worker
module, so a downloaded artifact can be checked on any machine.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcp_invariant import canonical, plan
from dcp_invariant.evidence import artifact, manifest, observation, provenance, rules, schema

# Eight world sizes give the largest plan: 8 resumes, 56 reshards and the torchrun restart.
_LAYOUT = re.compile(
    r"provenance\.json|summary\.json|junit\.xml|manifest\.sha256|(observations|results)/[a-z0-9_]{1,64}\.json"
)
_MAX_BYTES = max(schema.MAX_FILE_BYTES, schema.MAX_FIXTURE_FILE_BYTES)
_MAX_ENTRIES = 4 * len(schema.artifact_files(["x"] * (8 + 56 + 1)))


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The registered suite's plan, or the fixture plan its provenance records.
    run_plan: plan.Plan = plan.REGISTERED

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def passed(self) -> bool:
        return (
            self.valid
            and len(self.results) == len(self.run_plan.names)
            and all(r["verdict"] == "pass" for r in self.results.values())
        )


def verify_artifact(directory: Path) -> Report:
    report = Report()
    files = _read_files(Path(directory), report.problems)
    if files is None:
        return report
    report.run_plan = run_plan = _check_provenance(
        files.get(schema.PROVENANCE_FILE), report.problems
    )
    _check_layout(files, run_plan, report.problems)
    _check_manifest(files, run_plan, report.problems)
    for name in run_plan.names:
        obs = _load(files, schema.observation_file(name), report.problems)
        if obs is None:
            continue
        shape_problems = observation.validate(name, obs, run_plan)
        if shape_problems:
            report.problems += [f"{schema.observation_file(name)}: {p}" for p in shape_problems]
            continue
        report.results[name] = rules.result_record(name, obs, run_plan)
    # Results, then (when every scenario could be derived) summary and JUnit: all re-derived.
    expected = {schema.result_file(n): canonical.dumps(r) for n, r in report.results.items()}
    if len(report.results) == len(run_plan.names):
        expected.update(artifact.derived(report.results, run_plan))
    for rel, data in expected.items():
        if rel in files and files[rel] != data:
            report.problems.append(f"{rel}: differs from what its observations derive")
    return report


def _read_files(root: Path, problems: list[str]) -> dict[str, bytes] | None:
    """The artifact's regular files by relative path; problems for anything else found."""
    entries: list[tuple[str, os.stat_result]] = []
    try:
        _walk(root, "", entries)
    except NotADirectoryError:
        problems.append(f"{root.name}: not a directory")
        return None
    except _TooMany:
        problems.append(f"more than {_MAX_ENTRIES} entries: this is not an evidence artifact")
        return None
    except OSError as exc:
        problems.append(
            f"{canonical.printable(str(exc.filename))}: cannot be listed ({exc.strerror})"
        )
        return None
    files: dict[str, bytes] = {}
    for name, st in entries:
        rel = canonical.printable(name)
        if stat.S_ISDIR(st.st_mode):
            if rel not in schema.ARTIFACT_DIRS:
                problems.append(f"{rel}/: unexpected directory")
            continue
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"{rel}: not a regular file (symlinks and special files are refused)")
            continue
        if not _LAYOUT.fullmatch(rel):
            problems.append(f"{rel}: unexpected file")
            continue
        if st.st_size > _MAX_BYTES:
            problems.append(f"{rel}: {st.st_size} bytes, over the {_MAX_BYTES}-byte bound")
            continue
        try:
            with open(root / rel, "rb") as f:
                data = f.read(_MAX_BYTES + 1)
        except OSError as exc:
            problems.append(f"{rel}: cannot be read ({exc.strerror})")
            continue
        if len(data) > _MAX_BYTES:
            problems.append(f"{rel}: grew past the {_MAX_BYTES}-byte bound while read")
            continue
        files[rel] = data
    return files


def _check_layout(files: dict[str, bytes], run_plan: plan.Plan, problems: list[str]) -> None:
    """Exactly the plan's files, each within the plan's size bound; extra ones are dropped."""
    wanted = schema.artifact_files(run_plan.names)
    bound = schema.max_file_bytes(run_plan)
    for rel in sorted(set(files) - set(wanted)):
        problems.append(f"{rel}: unexpected file")
        del files[rel]
    for rel in wanted:
        if rel not in files:
            problems.append(f"{rel}: missing")
        elif len(files[rel]) > bound:
            problems.append(f"{rel}: {len(files[rel])} bytes, over the {bound}-byte bound")
            del files[rel]


class _TooMany(Exception):
    pass


def _walk(root: Path, prefix: str, out: list[tuple[str, os.stat_result]]) -> None:
    with os.scandir(root / prefix if prefix else root) as it:
        for entry in sorted(it, key=lambda e: e.name):
            rel = f"{prefix}/{entry.name}" if prefix else entry.name
            st = entry.stat(follow_symlinks=False)
            out.append((rel, st))
            if len(out) > _MAX_ENTRIES:
                raise _TooMany
            # Deeper directories are not walked: they are reported as unexpected.
            if stat.S_ISDIR(st.st_mode) and not prefix:
                _walk(root, rel, out)


def _load(files: dict[str, bytes], rel: str, problems: list[str]) -> Any:
    raw = files.get(rel)
    if raw is None:
        return None
    try:
        return canonical.loads(raw, what=rel)
    except canonical.CanonicalJSONError as exc:
        problems.append(str(exc))
        return None


def _check_manifest(files: dict[str, bytes], run_plan: plan.Plan, problems: list[str]) -> None:
    raw = files.get(schema.MANIFEST_FILE)
    if raw is None:
        return
    try:
        listed = manifest.parse(raw)
    except manifest.ManifestError as exc:
        problems.append(str(exc))
        return
    wanted = schema.artifact_files(run_plan.names)
    covered = [rel for rel in wanted if rel != schema.MANIFEST_FILE]
    for rel in sorted(set(listed) - set(covered)):
        problems.append(f"manifest.sha256: lists {rel}, which is not an artifact file")
    for rel in covered:
        if rel not in listed:
            problems.append(f"manifest.sha256: does not cover {rel}")
        elif rel in files and hashlib.sha256(files[rel]).hexdigest() != listed[rel]:
            problems.append(f"manifest.sha256: digest mismatch for {rel}")


def _check_provenance(raw: bytes | None, problems: list[str]) -> plan.Plan:
    """Problems of provenance.json, and the plan it records (the registered one if none)."""
    if raw is None:
        return plan.REGISTERED
    try:
        record = canonical.loads(raw, what=schema.PROVENANCE_FILE)
    except canonical.CanonicalJSONError as exc:
        problems.append(str(exc))
        return plan.REGISTERED
    versions = (schema.SCHEMA_VERSION, schema.FIXTURE_SCHEMA_VERSION)
    if not isinstance(record, dict) or record.get("schema_version") not in versions:
        version = record.get("schema_version") if isinstance(record, dict) else None
        problems.append(
            f"{schema.PROVENANCE_FILE}: unknown schema version {version!r}; "
            f"this verifier reads versions {list(versions)}"
        )
        return plan.REGISTERED
    problems += provenance.shape_problems(record)
    try:
        return provenance.recorded_plan(record)
    except plan.PlanError as exc:
        problems.append(f"{schema.PROVENANCE_FILE}: {exc}")
        return plan.REGISTERED
