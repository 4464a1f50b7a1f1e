"""The offline verifier: re-derives every verdict from the observations and checks every byte.

Imports the standard library and the package's pure modules only, never torch or a worker
module, so a downloaded artifact can be checked on any machine.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcp_invariant import canonical, plan
from dcp_invariant.evidence import artifact, manifest, observation, provenance, rules, schema

_MAX_ENTRIES = 4 * len(schema.ARTIFACT_FILES)


@dataclass
class Report:
    problems: list[str] = field(default_factory=list)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return not self.problems

    @property
    def passed(self) -> bool:
        return (
            self.valid
            and len(self.results) == len(plan.SCENARIO_NAMES)
            and all(r["verdict"] == "pass" for r in self.results.values())
        )


def verify_artifact(directory: Path) -> Report:
    report = Report()
    files = _read_files(Path(directory), report.problems)
    if files is None:
        return report
    _check_manifest(files, report.problems)
    _check_provenance(files.get(schema.PROVENANCE_FILE), report.problems)
    for name in plan.SCENARIO_NAMES:
        obs = _load(files, schema.observation_file(name), report.problems)
        if obs is None:
            continue
        shape_problems = observation.validate(name, obs)
        if shape_problems:
            report.problems += [f"{schema.observation_file(name)}: {p}" for p in shape_problems]
            continue
        report.results[name] = rules.result_record(name, obs)
    # Results, then (when every scenario could be derived) summary and JUnit: all re-derived.
    expected = {schema.result_file(n): canonical.dumps(r) for n, r in report.results.items()}
    if len(report.results) == len(plan.SCENARIO_NAMES):
        expected.update(artifact.derived(report.results))
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
        if rel not in schema.ARTIFACT_FILES:
            problems.append(f"{rel}: unexpected file")
            continue
        if st.st_size > schema.MAX_FILE_BYTES:
            problems.append(
                f"{rel}: {st.st_size} bytes, over the {schema.MAX_FILE_BYTES}-byte bound"
            )
            continue
        try:
            with open(root / rel, "rb") as f:
                data = f.read(schema.MAX_FILE_BYTES + 1)
        except OSError as exc:
            problems.append(f"{rel}: cannot be read ({exc.strerror})")
            continue
        if len(data) > schema.MAX_FILE_BYTES:
            problems.append(f"{rel}: grew past the {schema.MAX_FILE_BYTES}-byte bound while read")
            continue
        files[rel] = data
    seen = {name for name, _ in entries}
    problems += [f"{rel}: missing" for rel in schema.ARTIFACT_FILES if rel not in seen]
    return files


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


def _check_manifest(files: dict[str, bytes], problems: list[str]) -> None:
    raw = files.get(schema.MANIFEST_FILE)
    if raw is None:
        return
    try:
        listed = manifest.parse(raw)
    except manifest.ManifestError as exc:
        problems.append(str(exc))
        return
    covered = [rel for rel in schema.ARTIFACT_FILES if rel != schema.MANIFEST_FILE]
    for rel in sorted(set(listed) - set(covered)):
        problems.append(f"manifest.sha256: lists {rel}, which is not an artifact file")
    for rel in covered:
        if rel not in listed:
            problems.append(f"manifest.sha256: does not cover {rel}")
        elif rel in files and hashlib.sha256(files[rel]).hexdigest() != listed[rel]:
            problems.append(f"manifest.sha256: digest mismatch for {rel}")


def _check_provenance(raw: bytes | None, problems: list[str]) -> None:
    if raw is None:
        return
    try:
        record = canonical.loads(raw, what=schema.PROVENANCE_FILE)
    except canonical.CanonicalJSONError as exc:
        problems.append(str(exc))
        return
    if isinstance(record, dict) and record.get("schema_version") != schema.SCHEMA_VERSION:
        problems.append(
            f"{schema.PROVENANCE_FILE}: unknown schema version {record.get('schema_version')!r}; "
            f"this verifier reads version {schema.SCHEMA_VERSION}"
        )
        return
    problems += provenance.SHAPE(record, schema.PROVENANCE_FILE)
