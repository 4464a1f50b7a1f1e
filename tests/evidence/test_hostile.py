"""Hostile artifacts: the verifier and github-report never raise, never read outside the
artifact, stay bounded, and refuse with a specific reason.

The corpus in tests/data/hostile runs as plain tests; the Hypothesis tests below generate
more of the same kinds of input around every limit (bounded: ~100 examples each, no example
database written).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from hostile import apply_case, corpus_cases, load_case, reseal, watched_verify
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st
from mutation_walk import DATA, read_artifact

from dcp_invariant import canonical, cli, errors, github
from dcp_invariant.evidence import manifest, schema
from dcp_invariant.evidence.free_fields import free_field
from dcp_invariant.evidence.verify import _MAX_ENTRIES, Verification, verify_files

ARTIFACT = DATA / "artifact"
# Where a value sits in a JSON record: its keys and list indices from the top.
JSONPath = tuple[str | int, ...]
FILES = read_artifact(ARTIFACT)
JSON_FILES = sorted(rel for rel in FILES if rel.endswith(".json"))
# Bounded and repeatable: no example database; Hypothesis's own caches go to .hypothesis/,
# which it keeps out of git with a .gitignore of its own.
FUZZ = settings(
    max_examples=100,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _said(report: Verification) -> list[str]:
    return report.problems + [
        r
        for result in report.results.values()
        if result["verdict"] == "fail"
        for r in result["reasons"]
    ]


# --- the corpus --------------------------------------------------------------------------------


@pytest.mark.parametrize("path", corpus_cases(), ids=lambda p: p.stem)
def test_a_hostile_artifact_is_refused_for_its_reason(
    path: Path, artifact_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    case = load_case(path)
    apply_case(case, artifact_copy)

    report = watched_verify(artifact_copy)

    assert not report.passed
    assert any(case["expect"] in s for s in _said(report)), _said(report)
    # The command line and the GitHub report get through it too, with every output.
    assert cli.main(["verify", str(artifact_copy)]) == errors.EXIT_FAIL
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith(("verdict: invalid artifact", "fail: "))
    output = tmp_path / "output"
    argv = ["github-report", "--artifact-dir", str(artifact_copy), "--output-file", str(output)]
    assert cli.main([*argv, "--summary-file", str(tmp_path / "summary")]) == errors.EXIT_OK
    assert output.read_text().count("\n") == 8


def test_the_corpus_is_documented() -> None:
    keys = {"description", "file", "text", "base64", "repeat", "replace", "replace_base64"}
    keys |= {"prepend_base64", "add", "mkdir", "remove", "rederive", "reseal", "expect"}
    for path in corpus_cases():
        case = json.loads(path.read_text(encoding="utf-8"))
        assert set(case) <= keys, path.name
        assert case["expect"], path.name


# --- limits, on both sides ---------------------------------------------------------------------


@pytest.mark.parametrize("depth", [1, 63, 64, 65, 66, 900, 988, 989, 990, 991, 992, 5000, 100_000])
@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_nesting_around_every_limit(depth: int, opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    raw = (opener * depth + ("1" if opener != "[" else "") + closer * depth + "\n").encode()
    if depth <= canonical.MAX_DEPTH:
        assert canonical.nesting_depth(canonical.loads(raw)) == depth
        return
    with pytest.raises(canonical.CanonicalJSONError, match="nested more than 64 levels deep"):
        canonical.loads(raw)
    report = verify_files(_sealed({**FILES, schema.observation_file("training_1_to_1"): raw}))
    assert any("training_1_to_1.json: nested more than 64" in p for p in report.problems)


@pytest.mark.parametrize(
    ("digits", "accepted"),
    [
        (1, True),
        (19, True),
        (20, True),
        (21, False),
        (4300, False),
        (4301, False),
        (100_000, False),
    ],
)
def test_integers_around_the_digit_limit(digits: int, accepted: bool) -> None:
    raw = ("-" + "9" * digits + "\n").encode()
    if accepted:
        assert canonical.loads(raw) == -int("9" * digits)
    else:
        with pytest.raises(canonical.CanonicalJSONError, match=f"an integer of {digits} digits"):
            canonical.loads(raw)


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_file_size_around_the_bound(artifact_copy: Path, extra: int) -> None:
    rel = schema.observation_file("training_1_to_1")
    size = schema.MAX_FILE_BYTES + extra
    (artifact_copy / rel).write_bytes(b" " * (size - 1) + b"\n")
    reseal(artifact_copy)

    problems = watched_verify(artifact_copy).problems

    over = any("-byte bound" in p for p in problems)
    assert over == (extra > 0), problems
    assert any(rel in p for p in problems)


@pytest.mark.parametrize("extra", [0, 1])
def test_entries_around_the_bound(artifact_copy: Path, extra: int) -> None:
    present = sum(1 for _ in artifact_copy.rglob("*"))
    junk = artifact_copy / "junk"
    junk.mkdir()
    for i in range(_MAX_ENTRIES - present - 1 + extra):
        (junk / str(i)).write_bytes(b"")

    problems = watched_verify(artifact_copy).problems

    assert any("entries: this is not an evidence artifact" in p for p in problems) == bool(extra)


# --- Hypothesis ------------------------------------------------------------------------------


def _sealed(files: dict[str, bytes]) -> dict[str, bytes]:
    covered = {rel: data for rel, data in files.items() if rel != schema.MANIFEST_FILE}
    return {**covered, schema.MANIFEST_FILE: manifest.render(covered)}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One artifact copy per module; each example restores what it changed."""
    directory = tmp_path_factory.mktemp("fuzz") / "artifact"
    shutil.copytree(ARTIFACT, directory)
    yield directory


def _restore(directory: Path) -> None:
    for entry in sorted(directory.rglob("*"), reverse=True):
        rel = entry.relative_to(directory).as_posix()
        if rel in FILES or rel in schema.ARTIFACT_DIRS:
            continue
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    for rel, data in FILES.items():
        path = directory / rel
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)


@FUZZ
@given(rel=st.sampled_from(sorted(FILES)), where=st.floats(0, 1), byte=st.integers(0, 255))
def test_any_single_byte_change_is_refused_naming_the_file(
    workspace: Path, rel: str, where: float, byte: int
) -> None:
    data = bytearray(FILES[rel])
    i = min(int(where * len(data)), len(data) - 1)
    assume(data[i] != byte)
    data[i] = byte
    (workspace / rel).write_bytes(bytes(data))
    try:
        report = watched_verify(workspace)
    finally:
        _restore(workspace)

    assert not report.valid
    assert any(p.startswith(rel) or rel in p for p in report.problems), report.problems


_NAMES = st.one_of(
    st.sampled_from(
        ["notes.txt", "observations/extra.json", "results/x.json", "a b", "-", ".hidden"]
    ),
    st.binary(min_size=1, max_size=12).filter(
        lambda b: b"/" not in b and b"\0" not in b and b not in (b".", b"..")
    ),
)


@FUZZ
@given(
    removed=st.sets(st.sampled_from(sorted(FILES)), max_size=3), added=st.lists(_NAMES, max_size=3)
)
def test_removed_and_added_files_are_each_named(
    workspace: Path, removed: set[str], added: list[str | bytes]
) -> None:
    assume(removed or added)
    named: set[str] = set()
    try:
        for rel in removed:
            (workspace / rel).unlink()
        for name in added:
            raw = name if isinstance(name, bytes) else name.encode()
            target = os.path.join(os.fsencode(workspace), raw)
            try:
                if os.path.lexists(target):
                    continue
                with open(target, "wb") as f:
                    f.write(b"{}\n")
            except (OSError, ValueError):
                continue  # a name this filesystem refuses
            named.add(canonical.shown(os.fsdecode(raw)))
        assume(removed or named)
        report = watched_verify(workspace)
    finally:
        _restore(workspace)

    assert not report.valid
    for rel in removed:
        assert any(rel in p for p in report.problems), (rel, report.problems)
    for name in named:
        assert any(name in p for p in report.problems), (name, report.problems)


def _leaves(value: object, path: JSONPath = ()) -> Iterator[JSONPath]:
    if isinstance(value, dict):
        for key in sorted(value):
            yield from _leaves(value[key], (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, (*path, i))
    else:
        yield path


LEAVES = [(rel, path) for rel in JSON_FILES for path in _leaves(canonical.loads(FILES[rel]))]
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


@FUZZ
@given(leaf=st.sampled_from(LEAVES), value=_JSON)
def test_any_leaf_replaced_and_resealed_is_refused_unless_free(
    leaf: tuple[str, JSONPath], value: object
) -> None:
    rel, path = leaf
    record = canonical.loads(FILES[rel])
    parent = record
    for part in path[:-1]:
        parent = parent[part]
    assume(parent[path[-1]] != value or type(parent[path[-1]]) is not type(value))
    parent[path[-1]] = value
    try:
        data = canonical.dumps(record)
    except (TypeError, ValueError):
        return  # not encodable: no artifact can hold it
    report = verify_files(_sealed({**FILES, rel: data}))

    shown = "".join("[]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")
    if free_field(rel, shown) is None:
        assert not report.passed, (rel, path, value)
        assert _said(report)


def _reencode(value: object, how: str) -> bytes:
    if how == "unsorted":
        return (json.dumps(value, separators=(",", ":"), ensure_ascii=False) + "\n").encode()
    if how == "indented":
        return (json.dumps(value, sort_keys=True, indent=1, ensure_ascii=False) + "\n").encode()
    if how == "ascii":
        return (json.dumps(value, sort_keys=True, separators=(",", ":")) + "\n").encode()
    raise AssertionError(how)


def _reversed_keys(value: object) -> object:
    if isinstance(value, dict):
        return {k: _reversed_keys(value[k]) for k in sorted(value, reverse=True)}
    if isinstance(value, list):
        return [_reversed_keys(v) for v in value]
    return value


@FUZZ
@given(
    rel=st.sampled_from(JSON_FILES),
    how=st.sampled_from(
        ["reordered", "indented", "bom", "crlf", "space", "duplicate", "ascii", "no-lf", "two-lf"]
    ),
    where=st.floats(0, 1),
)
def test_non_canonical_encodings_are_refused_naming_the_file(
    rel: str, how: str, where: float
) -> None:
    raw = FILES[rel]
    value = canonical.loads(raw)
    if how == "reordered":
        data = _reencode(_reversed_keys(value), "unsorted")
    elif how == "indented":
        data = _reencode(value, "indented")
    elif how == "ascii":
        data = _reencode(value, "ascii")
        assume(data != raw)
    elif how == "bom":
        data = b"\xef\xbb\xbf" + raw
    elif how == "crlf":
        data = raw.replace(b"\n", b"\r\n")
    elif how == "no-lf":
        data = raw[:-1]
    elif how == "two-lf":
        data = raw + b"\n"
    elif how == "space":
        commas = [i for i, c in enumerate(raw) if c in b",:"]
        assume(commas)
        i = commas[min(int(where * len(commas)), len(commas) - 1)] + 1
        data = raw[:i] + b" " + raw[i:]
    else:  # a key of the top-level object given twice
        assume(isinstance(value, dict) and value)
        key = sorted(value)[min(int(where * len(value)), len(value) - 1)]
        pair = json.dumps({key: value[key]}, separators=(",", ":"), ensure_ascii=False)[1:-1]
        data = b"{" + pair.encode() + b"," + raw[1:]
    assume(data != raw)

    report = verify_files(_sealed({**FILES, rel: data}))

    assert not report.valid
    assert any(p.startswith(f"{rel}: ") for p in report.problems), report.problems


_HEX = st.text("0123456789abcdef", min_size=64, max_size=64)
_PATHS = st.one_of(
    st.sampled_from(
        [
            "/dev/zero",
            "/etc/passwd",
            "../x",
            "./junit.xml",
            "a//b",
            "x/../junit.xml",
            "/",
            "..",
            "results/",
        ]
    ),
    st.text(st.characters(codec="ascii"), min_size=1, max_size=20),
)


@FUZZ
@given(
    digest=_HEX | st.text(max_size=70),
    sep=st.sampled_from(["  ", " ", " *", "\t", "   "]),
    path=_PATHS,
    where=st.floats(0, 1),
)
def test_hostile_manifest_lines_are_refused_and_never_followed(
    workspace: Path, digest: str, sep: str, path: str, where: float
) -> None:
    lines = FILES[schema.MANIFEST_FILE].decode().splitlines(keepends=True)
    i = min(int(where * (len(lines) + 1)), len(lines))
    line = f"{digest}{sep}{path}\n"
    lines.insert(i, line)
    try:
        (workspace / schema.MANIFEST_FILE).write_bytes(
            "".join(lines).encode("utf-8", "surrogatepass")
        )
        report = watched_verify(workspace)  # asserts nothing outside was opened
    finally:
        _restore(workspace)

    assert not report.valid
    assert any(p.startswith(schema.MANIFEST_FILE) for p in report.problems), report.problems


@FUZZ
@given(
    rel=st.sampled_from(JSON_FILES),
    digits=st.integers(21, 6000),
    depth=st.integers(canonical.MAX_DEPTH + 1, 3000),
    kind=st.sampled_from(["int", "depth"]),
)
def test_huge_integers_and_deep_nesting_are_refused(
    rel: str, digits: int, depth: int, kind: str
) -> None:
    if kind == "int":
        data = FILES[rel].replace(b"}", b',"zz":' + b"7" * digits + b"}", 1)
        expected = f"an integer of {digits} digits"
    else:
        data = FILES[rel].replace(b"}", b',"zz":' + b"[" * depth + b"]" * depth + b"}", 1)
        expected = "nested more than 64 levels deep"

    report = verify_files(_sealed({**FILES, rel: data}))

    if rel.startswith("results/") or rel == schema.SUMMARY_FILE:
        expected = "differs from what its observations derive"  # compared, never parsed
    assert any(p.startswith(f"{rel}: ") and expected in p for p in report.problems), report.problems
    assert len(github.summary(ARTIFACT, report).encode()) <= github.MAX_SUMMARY_BYTES


def test_corpus_inputs_round_trip_through_base64() -> None:
    # The non-UTF-8 cases are stored as base64 and must decode to the bytes they describe.
    case = load_case(DATA / "hostile" / "name-not-utf8.json")
    assert base64.b64decode(case["add"]) == b"\xff"
