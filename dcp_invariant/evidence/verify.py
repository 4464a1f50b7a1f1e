"""The offline verifier: re-derives every verdict from the observations and checks every byte.

Imports the standard library and the package's pure modules only, never torch or a worker
module, so a downloaded artifact can be checked on any machine.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcp_invariant import canonical, errors, plan, regular_file, runtimes
from dcp_invariant.evidence import artifact, manifest, observation, provenance, rules, schema

# Eight world sizes give the largest plan: 8 resumes, 56 reshards and the torchrun restart, and
# 8 cross-release scenarios for each other release (upgrade_2.13.0_to_2.15.0_1: dots too).
_LAYOUT = re.compile(
    r"provenance\.json|summary\.json|junit\.xml|manifest\.sha256|(observations|results)/[a-z0-9_.]{1,64}\.json"
)
_MAX_ENTRIES = 4 * len(schema.artifact_files(["x"] * (8 + 56 + 1 + 8 * len(runtimes.releases()))))


@dataclass
class Verification:
    problems: list[str] = field(default_factory=list)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The registered suite's plan, or the fixture plan its provenance records.
    run_plan: plan.Plan = plan.REGISTERED
    # False for a directory with neither manifest.sha256 nor provenance.json: not an artifact
    # at all (a repository root, an empty directory), so its problems are not worth listing.
    artifact_like: bool = True

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


def verify_artifact(directory: Path) -> Verification:
    """Verify the artifact in ``directory``; every problem is reported, nothing is raised.

    Only the artifact's own regular files are opened, never what a symlink, the manifest or
    a name with ``..`` points at; files the plan does not name and files over its size bound
    are reported without being read.
    """
    report = Verification()
    unread: set[str] = set()
    files = _read_files(Path(directory), report, unread)
    if files is not None:
        _verify(files, report, unread)
    return report


def verify_files(files: Mapping[str, bytes]) -> Verification:
    """Verify an artifact given as its files' bytes by relative path: every check but reading."""
    report = Verification(
        artifact_like=bool({schema.MANIFEST_FILE, schema.PROVENANCE_FILE} & set(files))
    )
    _verify(dict(files), report, set())
    return report


def _verify(files: dict[str, bytes], report: Verification, unread: set[str]) -> None:
    problems = report.problems
    run_plan, recorded = _check_provenance(files.get(schema.PROVENANCE_FILE), problems)
    report.run_plan = run_plan
    _check_layout(files, run_plan, problems, unread)
    _check_manifest(files, run_plan, problems)
    observations: dict[str, dict[str, Any]] = {}
    for name in run_plan.names:
        obs = _load(files, schema.observation_file(name), problems)
        if obs is None:
            continue
        shape_problems = observation.validate(name, obs, run_plan=run_plan)
        if shape_problems:
            problems += [f"{schema.observation_file(name)}: {p}" for p in shape_problems]
            continue
        observations[name] = obs
    if recorded is not None:
        problems += _runtime_attested(recorded, observations)
    # Every scenario judged alone and against its siblings, exactly as the runner judged it.
    report.results = rules.results(observations, run_plan=run_plan)
    # Results, then (when every scenario could be derived) summary and JUnit: all re-derived.
    expected = {schema.result_file(n): canonical.dumps(r) for n, r in report.results.items()}
    if len(report.results) == len(run_plan.names):
        expected.update(artifact.derived(report.results, run_plan=run_plan))
    for rel, data in expected.items():
        if rel in files and files[rel] != data:
            problems.append(f"{rel}: differs from what its observations derive")


def _runtime_attested(recorded: dict[str, Any], observations: dict[str, Any]) -> list[str]:
    """The torchrun guard attests the torch it patched: the one provenance names."""
    obs = observations.get(plan.ELASTIC_SCENARIO.name)
    guard = obs["launcher"]["guard"] if obs is not None and obs["launcher"] else None
    if guard is None:
        return []
    problems = []
    where = schema.observation_file(plan.ELASTIC_SCENARIO.name)
    attested = (guard["torch_distribution"], guard["torch_runtime"])
    if attested != (recorded["torch_distribution"], recorded["torch_runtime"]):
        problems.append(
            f"{schema.PROVENANCE_FILE}: torch {recorded['torch_distribution']}/"
            f"{recorded['torch_runtime']}, but the torchrun guard in {where} attests "
            f"{attested[0]}/{attested[1]}"
        )
    listen = "127.0.0.1" if provenance.listens_on_loopback(recorded) else "torch-default"
    if guard["listen"] != listen:
        problems.append(
            f"{where}: the guard's store listens on {guard['listen']!r}, but on "
            f"{recorded['os']} it binds {listen!r}"
        )
    return problems


def _read_files(root: Path, report: Verification, unread: set[str]) -> dict[str, bytes] | None:
    """The artifact's regular files by relative path; problems for anything else found."""
    problems = report.problems
    shown_root = canonical.shown(root.name or str(root))
    try:
        root_stat = os.lstat(root)
    except (OSError, ValueError) as exc:
        problems.append(f"{shown_root}: cannot be read ({_why(exc)})")
        return None
    if stat.S_ISLNK(root_stat.st_mode):
        # A link can be repointed between checks and reads; verify the directory itself.
        problems.append(
            f"{shown_root}: is a symlink; pass the real artifact directory (symlinks are refused)"
        )
        return None
    if not stat.S_ISDIR(root_stat.st_mode):
        problems.append(f"{shown_root}: not a directory")
        return None
    report.artifact_like = any(
        _exists(root / name) for name in (schema.MANIFEST_FILE, schema.PROVENANCE_FILE)
    )
    entries: list[tuple[str, os.stat_result]] = []
    try:
        _walk(root, "", entries)
    except _TooMany:
        problems.append(f"more than {_MAX_ENTRIES} entries: this is not an evidence artifact")
        return None
    except OSError as exc:
        problems.append(f"{canonical.shown(str(exc.filename))}: cannot be listed ({_why(exc)})")
        return None
    found: dict[str, int] = {}
    for name, st in entries:
        rel = canonical.shown(name)
        if stat.S_ISDIR(st.st_mode):
            if rel not in schema.ARTIFACT_DIRS:
                problems.append(f"{rel}/: unexpected directory")
            continue
        if not stat.S_ISREG(st.st_mode):
            problems.append(f"{rel}: not a regular file (symlinks and special files are refused)")
            unread.add(rel)  # found, refused: not "missing" as well
            continue
        if rel != name or not _LAYOUT.fullmatch(rel):
            problems.append(f"{rel}: unexpected file")
            continue
        found[rel] = st.st_size
    # Provenance names the plan, and the plan names the files: nothing else is read.
    files: dict[str, bytes] = {}
    if found.get(schema.PROVENANCE_FILE, 0) > schema.MAX_FILE_BYTES:
        problems.append(
            f"{schema.PROVENANCE_FILE}: {found.pop(schema.PROVENANCE_FILE)} bytes, over the "
            f"{schema.MAX_FILE_BYTES}-byte bound"
        )
        unread.add(schema.PROVENANCE_FILE)
    elif schema.PROVENANCE_FILE in found:
        _read_one(root, schema.PROVENANCE_FILE, schema.MAX_FILE_BYTES, files, unread, problems)
    run_plan = _plan_of(files.get(schema.PROVENANCE_FILE))
    wanted = set(schema.artifact_files(run_plan.names))
    bound = schema.max_file_bytes(run_plan)
    for rel, size in sorted(found.items()):
        if rel == schema.PROVENANCE_FILE:
            continue
        if rel not in wanted:
            problems.append(f"{rel}: unexpected file")
        elif size > bound:
            problems.append(f"{rel}: {size} bytes, over the {bound}-byte bound")
            unread.add(rel)
        else:
            _read_one(root, rel, bound, files, unread, problems)
    return files


def _read_one(
    root: Path,
    rel: str,
    bound: int,
    files: dict[str, bytes],
    unread: set[str],
    problems: list[str],
) -> None:
    # The walk saw a regular file within the bound; the entry may have been swapped or grown since.
    try:
        files[rel] = regular_file.read(root / rel, bound=bound)
    except regular_file.NotRegularFile:
        problems.append(f"{rel}: not a regular file (symlinks and special files are refused)")
        unread.add(rel)
    except regular_file.OverBound:
        problems.append(f"{rel}: grew past the {bound}-byte bound while read")
        unread.add(rel)
    except OSError as exc:
        problems.append(f"{rel}: cannot be read ({_why(exc)})")
        unread.add(rel)


def _why(exc: BaseException) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__


def _exists(path: Path) -> bool:
    try:
        os.lstat(path)
    except OSError:
        return False
    return True


def _plan_of(raw: bytes | None) -> plan.Plan:
    """The plan provenance names, or the registered one; its problems are reported later."""
    return _check_provenance(raw, [])[0]


def _check_layout(
    files: dict[str, bytes], run_plan: plan.Plan, problems: list[str], unread: set[str]
) -> None:
    """Exactly the plan's files, each within the plan's size bound; extra ones are dropped."""
    wanted = schema.artifact_files(run_plan.names)
    bound = schema.max_file_bytes(run_plan)
    for rel in sorted(set(files) - set(wanted)):
        problems.append(f"{canonical.shown(rel)}: unexpected file")
        del files[rel]
    for rel in wanted:
        if rel in unread:
            continue  # found, and its problem already reported
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


def _check_provenance(
    raw: bytes | None, problems: list[str]
) -> tuple[plan.Plan, dict[str, Any] | None]:
    """Problems of provenance.json, the plan it records (the registered one if none), and the
    record itself when it is valid."""
    if raw is None:
        return plan.REGISTERED, None
    try:
        record = canonical.loads(raw, what=schema.PROVENANCE_FILE)
    except canonical.CanonicalJSONError as exc:
        problems.append(str(exc))
        return plan.REGISTERED, None
    versions = schema.VERSIONS
    if not isinstance(record, dict) or record.get("schema_version") not in versions:
        version = record.get("schema_version") if isinstance(record, dict) else None
        if version in schema.RETIRED_VERSIONS and type(version) is int:
            problems.append(
                f"{schema.PROVENANCE_FILE}: schema version {version} was written by an earlier "
                "dcp-invariant, whose records this one does not read; run the checks again "
                f"with this release (it writes versions {list(versions)})"
            )
        else:
            problems.append(
                f"{schema.PROVENANCE_FILE}: unknown schema version {version!r}; "
                f"this verifier reads versions {list(versions)}"
            )
        return plan.REGISTERED, None
    shape = provenance.shape_problems(record)
    problems += shape
    if shape and record.get("schema_version") != schema.SCHEMA_VERSION:
        return plan.REGISTERED, None  # a malformed plan names no files worth listing
    try:
        run_plan = provenance.recorded_plan(record)
    except errors.PlanError as exc:
        problems.append(f"{schema.PROVENANCE_FILE}: {exc}")
        return plan.REGISTERED, None
    return run_plan, None if shape else record
