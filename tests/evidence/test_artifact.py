"""The derived evidence files: JUnit, manifest, artifact layout and writing, provenance, runtimes."""

from __future__ import annotations

import hashlib
import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from artifact_data import DATA_ARTIFACT, read_observations, read_provenance

from dcp_invariant import canonical, plan, runtimes
from dcp_invariant.evidence import artifact, junit, manifest, provenance, rules, schema

Results = dict[str, dict[str, Any]]


def passing_results() -> Results:
    observations = read_observations(DATA_ARTIFACT)
    return {
        n: rules.result_record(n, observations[n], run_plan=plan.REGISTERED)
        for n in plan.SCENARIO_NAMES
    }


def failing(name: str, reasons: list[str]) -> dict[str, Any]:
    return {
        "reasons": reasons,
        "scenario": name,
        "schema_version": schema.SCHEMA_VERSION,
        "verdict": "fail",
    }


# --- junit -----------------------------------------------------------------------------------

SPECIAL = "a < b & c > \"d\" 'e'"


@pytest.fixture
def two_failures() -> Results:
    results = passing_results()
    results["dtensor_2_to_1"] = failing("dtensor_2_to_1", [SPECIAL, "second reason"])
    results["corrupt_shard"] = failing("corrupt_shard", ["only reason"])
    return results


def test_junit_has_one_testcase_per_scenario_in_schema_order(two_failures: Results) -> None:
    root = ET.fromstring(junit.render(two_failures, run_plan=plan.REGISTERED))

    cases = root.findall("./testsuite/testcase")
    assert [c.get("name") for c in cases] == list(plan.SCENARIO_NAMES)
    for element in (root, root.find("testsuite")):
        assert element is not None
        assert element.get("tests") == "11"
        assert element.get("failures") == "2"
        assert element.get("errors") == "0"


def test_junit_failures_carry_the_reasons(two_failures: Results) -> None:
    root = ET.fromstring(junit.render(two_failures, run_plan=plan.REGISTERED))

    failures = {
        c.get("name", ""): failure
        for c in root.iter("testcase")
        if (failure := c.find("failure")) is not None
    }
    assert set(failures) == {"dtensor_2_to_1", "corrupt_shard"}
    for name, failure in failures.items():
        reasons = two_failures[name]["reasons"]
        assert failure.get("message") == reasons[0]
        assert failure.text == "\n".join(reasons)


def test_junit_escapes_special_characters(two_failures: Results) -> None:
    raw = junit.render(two_failures, run_plan=plan.REGISTERED)

    # Parsing round-trips the text (checked above); the raw bytes show it was escaped, not
    # passed through.
    assert SPECIAL.encode() not in raw
    assert b"a &lt; b &amp; c &gt;" in raw


def test_junit_has_no_timings(two_failures: Results) -> None:
    raw = junit.render(two_failures, run_plan=plan.REGISTERED)

    assert b"time=" not in raw
    assert all(
        "time" not in e.attrib and "timestamp" not in e.attrib for e in ET.fromstring(raw).iter()
    )


def test_junit_of_the_real_run_matches_the_artifact() -> None:
    assert (
        junit.render(passing_results(), run_plan=plan.REGISTERED)
        == (DATA_ARTIFACT / schema.JUNIT_FILE).read_bytes()
    )


def test_junit_stays_well_formed_with_control_characters() -> None:
    results = passing_results()
    results["missing_shard"] = failing("missing_shard", ["error: \x1b[31mboom\x1b[0m"])

    ET.fromstring(junit.render(results, run_plan=plan.REGISTERED))


# --- manifest --------------------------------------------------------------------------------

FILES = {
    "summary.json": b"{}\n",
    "observations/b.json": b"b\n",
    "observations/a.json": b"",
    "junit.xml": b"<x/>\n",
}


def test_manifest_is_sorted_sha256sum_text() -> None:
    raw = manifest.render(FILES)

    lines = raw.decode("ascii").splitlines()
    assert raw.endswith(b"\n")
    assert [line.split("  ", 1)[1] for line in lines] == sorted(FILES)
    for line in lines:
        digest, path = re.fullmatch(r"([0-9a-f]{64})  (\S+)", line).groups()  # type: ignore[union-attr]
        assert digest == hashlib.sha256(FILES[path]).hexdigest()


def test_manifest_round_trips() -> None:
    parsed = manifest.parse(manifest.render(FILES))

    assert parsed == {p: hashlib.sha256(d).hexdigest() for p, d in FILES.items()}
    assert list(parsed) == sorted(FILES)


def test_manifest_of_the_real_run_parses() -> None:
    raw = (DATA_ARTIFACT / schema.MANIFEST_FILE).read_bytes()

    assert list(manifest.parse(raw)) == [
        r for r in schema.ARTIFACT_FILES if r != schema.MANIFEST_FILE
    ]


GOOD_A = f"{'a' * 64}  a.json\n"
GOOD_B = f"{'b' * 64}  b.json\n"


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"", "must end with a newline"),
        (GOOD_A.rstrip("\n").encode(), "must end with a newline"),
        (b"\n", "line 1"),
        (f"{'a' * 64} a.json\n".encode(), "line 1"),  # one space
        (f"{'a' * 64}  *a.json\n".encode(), "line 1"),  # binary-mode marker
        (f"{'A' * 64}  a.json\n".encode(), "line 1"),
        (f"{'a' * 63}  a.json\n".encode(), "line 1"),
        ((GOOD_A + f"{'a' * 64}  a b.json\n").encode(), "line 2"),
        (GOOD_A.replace("\n", "\r\n").encode(), "line 1"),
        ((GOOD_A + GOOD_A).encode(), "a.json listed twice"),
        ((GOOD_B + GOOD_A).encode(), "sorted"),
        ((GOOD_A + "\n").encode(), "line 2"),
        (f"{'a' * 64}  é.json\n".encode(), "not ASCII"),
    ],
    ids=[
        "empty",
        "no trailing newline",
        "blank line",
        "one space",
        "binary marker",
        "uppercase digest",
        "short digest",
        "space in path",
        "CRLF",
        "duplicate",
        "unsorted",
        "trailing blank line",
        "non-ASCII",
    ],
)
def test_manifest_parse_rejects(raw: bytes, text: str) -> None:
    with pytest.raises(manifest.ManifestError, match=re.escape(text)) as info:
        manifest.parse(raw)
    assert str(info.value).startswith("manifest.sha256")


# --- artifact --------------------------------------------------------------------------------


def test_build_produces_exactly_the_schema_files() -> None:
    files = artifact.build(
        read_observations(DATA_ARTIFACT), read_provenance(DATA_ARTIFACT), run_plan=plan.REGISTERED
    )

    assert tuple(sorted(files)) == schema.ARTIFACT_FILES
    assert len(files) == 26


def test_build_reproduces_the_real_artifact_byte_for_byte() -> None:
    # Same observations and provenance, same bytes: nothing run-varying leaks into evidence.
    files = artifact.build(
        read_observations(DATA_ARTIFACT), read_provenance(DATA_ARTIFACT), run_plan=plan.REGISTERED
    )

    for rel, data in files.items():
        assert data == (DATA_ARTIFACT / rel).read_bytes(), rel


def test_build_refuses_an_incomplete_set_of_observations() -> None:
    observations = read_observations(DATA_ARTIFACT)
    del observations["missing_shard"]

    with pytest.raises(ValueError, match="expected observations"):
        artifact.build(observations, read_provenance(DATA_ARTIFACT), run_plan=plan.REGISTERED)


def test_build_refuses_an_unknown_scenario() -> None:
    observations = read_observations(DATA_ARTIFACT)
    observations["extra"] = observations["missing_shard"]

    with pytest.raises(ValueError, match="expected observations"):
        artifact.build(observations, read_provenance(DATA_ARTIFACT), run_plan=plan.REGISTERED)


def _files() -> dict[str, bytes]:
    return artifact.build(
        read_observations(DATA_ARTIFACT), read_provenance(DATA_ARTIFACT), run_plan=plan.REGISTERED
    )


# --- provenance ------------------------------------------------------------------------------


def _provenance(os: str | None = None, **overrides: Any) -> dict[str, Any]:
    arguments: dict[str, Any] = {
        "source_revision": "0123456789abcdef0123456789abcdef01234567",
        "torch_distribution": "2.13.0+cpu",
        "torch_runtime": "2.13.0+cpu",
        "numpy": "2.4.6",
        "run_plan": plan.REGISTERED,
    }
    record = provenance.build(**{**arguments, **overrides})
    if os is not None:
        record["os"] = os  # as a run on that OS records it
    return record


def test_provenance_is_unauthenticated_and_valid() -> None:
    record = _provenance()

    assert record["authenticated"] is False
    assert record["schema_version"] == schema.SCHEMA_VERSION
    assert record["source_revision"] == "0123456789abcdef0123456789abcdef01234567"
    assert provenance.SHAPE(record, schema.PROVENANCE_FILE) == []
    # It must also be encodable as evidence.
    assert canonical.loads(canonical.dumps(record)) == record


def test_provenance_without_numpy_is_valid() -> None:
    assert provenance.SHAPE(_provenance(numpy=None), schema.PROVENANCE_FILE) == []


def test_provenance_of_a_run_outside_a_checkout_is_valid() -> None:
    record = _provenance(source_revision=provenance.UNKNOWN_REVISION)
    assert provenance.SHAPE(record, schema.PROVENANCE_FILE) == []


@pytest.mark.parametrize(
    ("key", "value", "text"),
    [
        ("authenticated", True, "authenticated: expected one of [False]"),
        ("source_revision", "HEAD", "a 40-hex source revision or 'unknown'"),
        ("source_revision", "Unknown", "a 40-hex source revision or 'unknown'"),
        ("schema_version", 1, "schema_version: expected one of [2]"),
        ("tool", None, "tool: expected one of ['dcp-invariant 0.5.0']"),
        ("tool", "dcp-invariant 9.9.9", "tool: expected one of ['dcp-invariant 0.5.0']"),
        ("tool", "dcp-invariant 0.5.0 ", "tool: expected one of"),
        ("cpython", "3.11", "a CPython version, 3.11 or newer"),
        ("cpython", "3.10.14", "a CPython version, 3.11 or newer"),
        ("cpython", "3.11.7x", "a CPython version"),
        ("cpython", "PyPy 7.3", "a CPython version"),
        ("numpy", "2.4.6x", "a numpy version"),
        ("numpy", "", "a numpy version"),
        ("torch_distribution", "3.13.0+cpu", "torch 3.13.0+cpu/2.13.0+cpu is not a registered"),
        ("torch_runtime", "2.11.0+cpu", "torch 2.13.0+cpu/2.11.0+cpu is not a registered"),
    ],
)
def test_provenance_shape_rejects(key: str, value: Any, text: str) -> None:
    record = {**_provenance(), key: value}

    problems = provenance.shape_problems(record)
    assert any(text in p for p in problems), problems


@pytest.mark.parametrize("version", ["3.11.0", "3.12.10", "3.13.0rc2", "3.14.0a1+", "3.20.1"])
def test_provenance_accepts_cpython_versions(version: str) -> None:
    assert provenance.shape_problems({**_provenance(), "cpython": version}) == []


@pytest.mark.parametrize("version", [None, "2.4.6", "2.5.0rc1", "2.5.0.dev0+git20250101.abcdef0"])
def test_provenance_accepts_numpy_versions(version: str | None) -> None:
    assert provenance.shape_problems({**_provenance(), "numpy": version}) == []


_OS_OF = {platform: os for os, platform in provenance.OS_PLATFORMS.items()}


@pytest.mark.parametrize(
    ("registered", "os"),
    [(r, _OS_OF[p]) for r in runtimes.RUNTIMES for p in r.platforms],
    ids=lambda v: v if isinstance(v, str) else v.distribution,
)
def test_provenance_accepts_every_registered_runtime_on_its_os(
    registered: runtimes.Runtime, os: str
) -> None:
    record = _provenance(
        torch_distribution=registered.distribution, torch_runtime=registered.torch, os=os
    )
    assert provenance.shape_problems(record) == []


def test_provenance_refuses_a_pair_its_os_never_reports() -> None:
    # PyPI's Linux torch 2.13.0 is a CUDA build; only macOS's CPU wheel reports plain 2.13.0.
    record = _provenance(torch_distribution="2.13.0", torch_runtime="2.13.0", os="Linux")
    assert any("not a registered runtime on Linux" in p for p in provenance.shape_problems(record))


def test_real_provenance_is_valid() -> None:
    assert provenance.SHAPE(read_provenance(DATA_ARTIFACT), schema.PROVENANCE_FILE) == []


def test_the_real_run_used_a_registered_runtime() -> None:
    record = read_provenance(DATA_ARTIFACT)

    assert runtimes.find(record["torch_distribution"], record["torch_runtime"]) is not None
