"""The offline verifier: every way an artifact can be incomplete, tampered or malformed.

Each bad artifact starts as a copy of the real one and breaks exactly one thing. Where the
break would also trip the manifest, the manifest is resealed so that the check under test is
the one that has to catch it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
from artifact_data import Observations, Rebuild, read_observations
from forge import reaggregate
from hostile import reseal

from dcp_invariant import canonical, plan
from dcp_invariant.evidence import rules, schema
from dcp_invariant.evidence.verify import verify_artifact

SUBPROCESS_TIMEOUT = 120

OBS = schema.observation_file("training_2_to_2")
RESULT = schema.result_file("training_2_to_2")


def load(directory: Path, rel: str) -> dict[str, Any]:
    return cast(dict[str, Any], canonical.loads((directory / rel).read_bytes()))


def store(directory: Path, rel: str, value: dict[str, Any]) -> None:
    (directory / rel).write_bytes(canonical.dumps(value))


def edit(rel: str, change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    """A mutation that rewrites ``rel`` canonically after ``change``."""

    def mutate(directory: Path) -> None:
        value = load(directory, rel)
        change(value)
        store(directory, rel, value)

    return mutate


def replace_bytes(rel: str, old: bytes, new: bytes) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        raw = (directory / rel).read_bytes()
        assert raw.count(old) >= 1, f"{old!r} not in {rel}: the mutation would test nothing"
        (directory / rel).write_bytes(raw.replace(old, new, 1))

    return mutate


def write(rel: str, data: bytes) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        (directory / rel).write_bytes(data)

    return mutate


def remove(rel: str) -> Callable[[Path], None]:
    return lambda directory: (directory / rel).unlink()


def make_dir(rel: str) -> Callable[[Path], None]:
    return lambda directory: (directory / rel).mkdir()


def pretty(rel: str) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        value = load(directory, rel)
        (directory / rel).write_bytes(json.dumps(value, indent=2, sort_keys=True).encode() + b"\n")

    return mutate


def manifest_lines(change: Callable[[list[str]], list[str]]) -> Callable[[Path], None]:
    def mutate(directory: Path) -> None:
        path = directory / schema.MANIFEST_FILE
        lines = path.read_text("ascii").splitlines()
        path.write_text("".join(f"{line}\n" for line in change(lines)), "ascii")

    return mutate


def _drop_line(rel: str) -> Callable[[list[str]], list[str]]:
    return lambda lines: [line for line in lines if not line.endswith(f"  {rel}")]


def _add_line(rel: str) -> Callable[[list[str]], list[str]]:
    return lambda lines: sorted([*lines, f"{'0' * 64}  {rel}"], key=lambda line: line[66:])


def _swap_first_two(lines: list[str]) -> list[str]:
    return [lines[1], lines[0], *lines[2:]]


def _corrupt_digest_of(rel: str) -> Callable[[list[str]], list[str]]:
    def change(lines: list[str]) -> list[str]:
        out = []
        for line in lines:
            if line.endswith(f"  {rel}"):
                line = ("1" if line[0] != "1" else "2") + line[1:]
            out.append(line)
        return out

    return change


def _flip_verdict(result: dict[str, Any]) -> None:
    result["verdict"] = "fail"


def _summary_claims_a_failure(summary: dict[str, Any]) -> None:
    summary["passed"] -= 1
    summary["failed"] += 1


def _set(path: tuple[str, ...], value: object) -> Callable[[dict[str, Any]], None]:
    def change(record: dict[str, Any]) -> None:
        target = record
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return change


# (id, mutation, reseal the manifest afterwards, file the problem must name, text it must contain)
CASES = [
    ("missing observation", remove(OBS), False, OBS, "missing"),
    ("missing result", remove(RESULT), False, RESULT, "missing"),
    ("missing provenance", remove(schema.PROVENANCE_FILE), False, "provenance.json", "missing"),
    ("missing manifest", remove(schema.MANIFEST_FILE), False, "manifest.sha256", "missing"),
    ("extra top-level file", write("notes.txt", b"hi\n"), False, "notes.txt", "unexpected file"),
    (
        "extra observation",
        write("observations/extra.json", b"{}\n"),
        False,
        "observations/extra.json",
        "unexpected file",
    ),
    ("extra directory", make_dir("extra"), False, "extra/", "unexpected directory"),
    (
        "nested directory",
        make_dir("observations/nested"),
        False,
        "observations/nested/",
        "unexpected directory",
    ),
    (
        "file over the size bound",
        write(OBS, b" " * (schema.MAX_FILE_BYTES + 1)),
        True,
        OBS,
        "-byte bound",
    ),
    (
        "invalid UTF-8",
        replace_bytes(OBS, b"registered_fixture", b"\xffegistered_fixture"),
        True,
        OBS,
        "not valid UTF-8",
    ),
    ("pretty-printed observation", pretty(OBS), True, OBS, "not canonical JSON"),
    (
        "pretty-printed provenance",
        pretty(schema.PROVENANCE_FILE),
        True,
        "provenance.json",
        "not canonical JSON",
    ),
    ("no trailing LF", replace_bytes(OBS, b"}\n", b"}"), True, OBS, "not canonical JSON"),
    (
        "duplicate key",
        replace_bytes(OBS, b"{", b'{"errors":[],'),
        True,
        OBS,
        "duplicate key 'errors'",
    ),
    ("NaN", replace_bytes(OBS, b'"errors":[]', b'"errors":[NaN]'), True, OBS, "NaN is not allowed"),
    (
        "Infinity",
        replace_bytes(OBS, b'"errors":[]', b'"errors":[-Infinity]'),
        True,
        OBS,
        "-Infinity is not allowed",
    ),
    (
        "float",
        replace_bytes(OBS, b'"steps_before_save":3', b'"steps_before_save":3.0'),
        True,
        OBS,
        "float 3.0",
    ),
    (
        "unknown provenance schema version",
        edit(schema.PROVENANCE_FILE, _set(("schema_version",), 9)),
        True,
        "provenance.json",
        "unknown schema version 9",
    ),
    (
        "an earlier release's schema version",
        edit(schema.PROVENANCE_FILE, _set(("schema_version",), 5)),
        True,
        "provenance.json",
        "schema version 5 was written by an earlier dcp-invariant, whose records this one does "
        "not read; run the checks again with this release (it writes versions [2, 7, 8])",
    ),
    (
        "provenance claims authentication",
        edit(schema.PROVENANCE_FILE, _set(("authenticated",), True)),
        True,
        "provenance.json",
        "authenticated",
    ),
    (
        "unknown observation schema version",
        edit(OBS, _set(("schema_version",), 9)),
        True,
        OBS,
        "schema_version: expected one of [2, 7, 8], got 9",
    ),
    (
        "observation with an unknown key",
        edit(OBS, _set(("extra",), 1)),
        True,
        OBS,
        "unknown key 'extra'",
    ),
    (
        "observation with a wrong type",
        edit(OBS, _set(("source", "exit_codes"), ["0", "0"])),
        True,
        OBS,
        "expected an integer, got str",
    ),
    (
        "observation of another scenario",
        edit(OBS, _set(("scenario",), "training_1_to_1")),
        True,
        OBS,
        "scenario: expected 'training_2_to_2'",
    ),
    (
        "edited file, manifest not updated",
        edit(schema.PROVENANCE_FILE, _set(("cpython",), "3.99.0")),
        False,
        "provenance.json",
        "digest mismatch",
    ),
    (
        "manifest digest altered",
        manifest_lines(_corrupt_digest_of(schema.SUMMARY_FILE)),
        False,
        "summary.json",
        "digest mismatch",
    ),
    (
        "manifest missing a line",
        manifest_lines(_drop_line(schema.JUNIT_FILE)),
        False,
        "junit.xml",
        "does not cover",
    ),
    (
        "manifest lists an unknown file",
        manifest_lines(_add_line("observations/extra.json")),
        False,
        "observations/extra.json",
        "not an artifact file",
    ),
    (
        "manifest lists itself",
        manifest_lines(_add_line(schema.MANIFEST_FILE)),
        False,
        "manifest.sha256",
        "not an artifact file",
    ),
    ("manifest unsorted", manifest_lines(_swap_first_two), False, "manifest.sha256", "sorted"),
    (
        "manifest with CRLF",
        replace_bytes(schema.MANIFEST_FILE, b"\n", b"\r\n"),
        False,
        "manifest.sha256",
        "line 1",
    ),
    (
        "result differs from its re-derivation",
        edit(RESULT, _flip_verdict),
        True,
        RESULT,
        "differs from what its observations derive",
    ),
    (
        "summary edited",
        edit(schema.SUMMARY_FILE, _summary_claims_a_failure),
        True,
        "summary.json",
        "differs from what its observations derive",
    ),
    (
        "junit edited",
        replace_bytes(schema.JUNIT_FILE, b'failures="0"', b'failures="1"'),
        True,
        "junit.xml",
        "differs from what its observations derive",
    ),
]


@pytest.mark.parametrize(
    ("mutate", "resealed", "offender", "text"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_verifier_rejects(
    artifact_copy: Path,
    mutate: Callable[[Path], None],
    resealed: bool,
    offender: str,
    text: str,
) -> None:
    mutate(artifact_copy)
    if resealed:
        reseal(artifact_copy)

    report = verify_artifact(artifact_copy)

    assert not report.valid
    assert not report.passed
    assert any(offender in p and text in p for p in report.problems), report.problems
    # One break, one culprit: nothing else in the artifact is blamed for it.
    assert all(offender in p for p in report.problems), report.problems
    if resealed:
        # The manifest matched, so the rejection came from the deeper check.
        assert not any(p.startswith(schema.MANIFEST_FILE) for p in report.problems)


def test_result_flip_is_caught_only_by_rederivation(artifact_copy: Path) -> None:
    # Summary and JUnit are re-derived from the observations, not the results files, so a
    # flipped result that the manifest covers is exactly one problem.
    edit(RESULT, _flip_verdict)(artifact_copy)
    reseal(artifact_copy)

    report = verify_artifact(artifact_copy)

    assert report.problems == [f"{RESULT}: differs from what its observations derive"]
    assert report.results["training_2_to_2"]["verdict"] == "pass"


def test_symlink_in_place_of_a_file_is_refused(artifact_copy: Path, tmp_path: Path) -> None:
    # The link points at identical bytes, so only the file-type check can object.
    original = tmp_path / "outside.json"
    shutil.move(artifact_copy / OBS, original)
    try:
        os.symlink(original, artifact_copy / OBS)
    except (OSError, NotImplementedError) as exc:
        pytest.skip(f"symlinks unsupported here: {exc}")

    report = verify_artifact(artifact_copy)

    assert not report.valid
    assert any(OBS in p and "not a regular file" in p for p in report.problems), report.problems


def test_symlinked_directory_is_refused(artifact_copy: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    shutil.move(artifact_copy / "results", outside)
    try:
        os.symlink(outside, artifact_copy / "results", target_is_directory=True)
    except (OSError, NotImplementedError) as exc:
        pytest.skip(f"symlinks unsupported here: {exc}")

    report = verify_artifact(artifact_copy)

    assert not report.valid
    assert any(p.startswith("results:") and "not a regular file" in p for p in report.problems)


def test_too_many_entries_stop_the_walk(artifact_copy: Path) -> None:
    # A bound on entries keeps a hostile directory tree from being walked in full.
    junk = artifact_copy / "junk"
    junk.mkdir()
    for i in range(1000):
        (junk / f"{i}").write_bytes(b"")

    report = verify_artifact(artifact_copy)

    assert not report.valid
    assert any("more than" in p and "entries" in p for p in report.problems)
    assert report.results == {}


def test_a_file_instead_of_a_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "artifact"
    path.write_bytes(b"not a directory\n")

    report = verify_artifact(path)

    assert not report.valid
    assert report.problems == ["artifact: not a directory"]


def test_untouched_artifact_is_valid_and_passed(data_artifact: Path) -> None:
    report = verify_artifact(data_artifact)

    assert report.problems == []
    assert report.valid
    assert report.passed
    # The results the verifier derives are the ones the runner wrote.
    assert report.results == {
        n: load(data_artifact, schema.result_file(n)) for n in plan.SCENARIO_NAMES
    }


def _break_rng(obs: dict[str, Any]) -> None:
    digests = obs["target"]["ranks"][-1]["loaded"]
    digests["rng"] = "0" * 64
    reaggregate(digests)


def _promote_candidate(obs: dict[str, Any]) -> None:
    obs["candidate"]["promoted"] = True


@pytest.mark.parametrize(
    ("name", "mutate", "text"),
    [
        ("training_2_to_2", _break_rng, "'rng'"),
        ("elastic_restart_2_to_2", _break_rng, "'rng'"),
        ("corrupt_shard", _promote_candidate, "was promoted"),
    ],
)
def test_rebuilt_artifact_with_a_failing_observation_is_valid_but_not_passed(
    rebuild: Rebuild, name: str, mutate: Callable[[dict[str, Any]], None], text: str
) -> None:
    def mutate_all(observations: Observations) -> None:
        mutate(observations[name])

    directory = rebuild(mutate_all)
    mutated = read_observations(directory)[name]

    report = verify_artifact(directory)

    assert report.problems == []
    assert report.valid
    assert not report.passed
    failed = report.results[name]
    assert failed["verdict"] == "fail"
    assert failed["reasons"] == rules.derive(name, mutated, run_plan=plan.REGISTERED)
    assert any(text in r for r in failed["reasons"]), failed["reasons"]
    assert all(r["verdict"] == "pass" for n, r in report.results.items() if n != name)


def test_out_of_range_dying_rank_is_reported_not_raised(artifact_copy: Path) -> None:
    edit(schema.observation_file("rank_exit_no_promotion"), _set(("dying_rank",), 2))(artifact_copy)
    reseal(artifact_copy)

    report = verify_artifact(artifact_copy)

    assert not report.passed


# What `verify` may load, by allow-list: anything new is forbidden until it is added here.
_ALLOWED_CHECK = r"""
import json, sys
before = set(sys.modules)
from dcp_invariant import cli
rc = cli.main(["verify", sys.argv[1]])
allowed = {"dcp_invariant", "dcp_invariant.cli", "dcp_invariant.canonical", "dcp_invariant.runtimes",
           "dcp_invariant.plan", "dcp_invariant.dcp_layout", "dcp_invariant.fixture_inputs",
           "dcp_invariant.errors", "dcp_invariant.regular_file",
           "dcp_invariant.python_api", "dcp_invariant.evidence"}
ours = sorted(m for m in sys.modules if m.split(".")[0] == "dcp_invariant")
outside = sorted(m for m in ours if m not in allowed and not m.startswith("dcp_invariant.evidence."))
third_party = sorted(
    m for m in set(sys.modules) - before
    if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "dcp_invariant"
)
print(json.dumps({"rc": rc, "outside": outside, "third_party": third_party,
                  "verified": "dcp_invariant.evidence.verify" in sys.modules}))
"""


def test_verify_loads_only_the_evidence_side_and_the_standard_library(
    artifact_copy: Path, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _ALLOWED_CHECK, str(artifact_copy)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        cwd=tmp_path,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.splitlines()[-1])
    # The verifier really ran and passed, so empty lists mean something.
    assert outcome["verified"] is True
    assert outcome["rc"] == 0
    assert outcome["outside"] == []
    assert outcome["third_party"] == []


def test_verify_lists_an_undecodable_file_name(artifact_copy: Path, tmp_path: Path) -> None:
    try:
        with open(os.path.join(os.fsencode(artifact_copy), b"\xff"), "wb") as f:
            f.write(b"x")
    except (OSError, ValueError) as exc:
        pytest.skip(f"this filesystem refuses non-UTF-8 names: {exc}")
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    done = subprocess.run(
        [sys.executable, "-m", "dcp_invariant", "verify", str(artifact_copy)],
        capture_output=True,
        timeout=SUBPROCESS_TIMEOUT,
        cwd=tmp_path,
        env=env,
        check=False,
    )

    assert b"Traceback" not in done.stderr
    assert done.returncode == 1
    assert done.stdout.splitlines()[-1].startswith(b"verdict: invalid artifact (1 problems)")


def test_sha256sum_checks_the_manifest(artifact_copy: Path) -> None:
    if shutil.which("sha256sum") is None:
        pytest.skip("sha256sum is not on PATH")
    done = subprocess.run(
        ["sha256sum", "-c", schema.MANIFEST_FILE],
        cwd=artifact_copy,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    checked = sorted(line.rsplit(": ", 1)[0] for line in done.stdout.splitlines())
    assert checked == [rel for rel in schema.ARTIFACT_FILES if rel != schema.MANIFEST_FILE]


def test_sha256sum_notices_an_edit(artifact_copy: Path) -> None:
    # The other half of the claim: the manifest's format is one sha256sum really checks.
    if shutil.which("sha256sum") is None:
        pytest.skip("sha256sum is not on PATH")
    edit(schema.PROVENANCE_FILE, _set(("cpython",), "3.99.0"))(artifact_copy)
    done = subprocess.run(
        ["sha256sum", "-c", schema.MANIFEST_FILE],
        cwd=artifact_copy,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        check=False,
    )

    assert done.returncode != 0
    assert f"{schema.PROVENANCE_FILE}: FAILED" in done.stdout
