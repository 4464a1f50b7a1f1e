"""Every single-leaf edit of every checked-in artifact, resealed, is refused by ``verify``.

The manifest is unsigned, so a forger recomputes it; what stops a doctored artifact is the
semantic checking. For each artifact under tests/data (and a synthetic fixture run until a real
one is checked in) every leaf of every JSON file is edited once per edit that applies
(:mod:`mutation_walk`), the manifest is recomputed, and the verifier must refuse the result,
naming the edited file or its scenario, unless the leaf is a free field
(:mod:`dcp_invariant.evidence.free_fields`). Each free field must also be really unchecked, so
the list cannot keep a field that has since become checkable.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest
import synthetic
from mutation_walk import DATA, artifact_dirs, count, mutations, read_artifact

from dcp_invariant import plan
from dcp_invariant.evidence import observation, rules, schema, verify
from dcp_invariant.evidence.free_fields import FREE_FIELDS, free_field
from dcp_invariant.evidence.verify import verify_files

# The page that lists the free fields (the README points to it).
EVIDENCE_PAGE = Path(__file__).parent.parent.parent / "docs" / "evidence.md"
SYNTHETIC = "synthetic fixture run"
ARTIFACTS = {p.relative_to(DATA).as_posix(): p for p in artifact_dirs()}


@dataclass
class Outcome:
    tried: int = 0
    rejected: int = 0
    free: Counter[str] = field(default_factory=Counter)  # passing edits by free-field path
    unexplained: list[str] = field(default_factory=list)  # passed, and not a free field
    unnamed: list[str] = field(default_factory=list)  # refused without naming the culprit
    sampled: bool = False  # each edit of each field made at most PER_FIELD times


def _files(name: str) -> dict[str, bytes]:
    return synthetic.build() if name == SYNTHETIC else read_artifact(ARTIFACTS[name])


# Past this many edits (a fixture run of a real model: every key recorded for every rank, step
# and arm) each edit of each field, list positions aside, is made PER_FIELD times: every field
# is still edited every way, and the whole test stays well under a minute (about 16 s of CPU
# for a run of the example's size, ~10,000 edits).
BUDGET = 8000
PER_FIELD = 1


class Judge(Protocol):
    """``observation.validate`` and ``rules.derive``: the problems or reasons of one observation."""

    def __call__(self, name: str, obs: Any, /, *, run_plan: plan.Plan) -> list[str]: ...


@contextlib.contextmanager
def unchanged_files_parsed_once() -> Iterator[None]:
    """Each edit changes one file; parsing, shape-checking and judging the others again would
    only repeat pure functions of the same bytes, so their results are kept. Everything else
    (the edited file's parse, shape and rules, the layout, manifest, provenance, consistency
    across scenarios, derivations) runs as ``verify`` runs it."""
    load, validate, derive = verify._load, observation.validate, rules.derive
    loaded: dict[tuple[str, bytes | None], tuple[Any, list[str]]] = {}

    def cached_load(files: dict[str, bytes], rel: str, problems: list[str]) -> Any:
        key = (rel, files.get(rel))
        if key not in loaded:
            found: list[str] = []
            loaded[key] = (load(files, rel, found), found)
        value, found = loaded[key]
        problems += found
        return value

    cached_validate, cached_derive = _per_observation(validate), _per_observation(derive)
    verify._load, observation.validate = cached_load, cached_validate  # type: ignore[assignment]
    rules.derive = cached_derive  # type: ignore[assignment]
    try:
        yield
    finally:
        verify._load, observation.validate, rules.derive = load, validate, derive


def _per_observation(judge: Judge) -> Judge:
    """``judge`` computed once per scenario and observation. The observation is the very object
    cached_load keeps for its file's bytes, which stays alive: its id names those bytes."""
    kept: dict[tuple[str, int, plan.Plan], list[str]] = {}

    def cached(name: str, obs: Any, *, run_plan: plan.Plan) -> list[str]:
        key = (name, id(obs), run_plan)
        if key not in kept:
            kept[key] = judge(name, obs, run_plan=run_plan)
        return list(kept[key])

    return cached


@functools.cache
def outcome(name: str) -> Outcome:
    out = Outcome()
    files = _files(name)
    out.sampled = count(files) > BUDGET
    with unchanged_files_parsed_once():
        _walk(out, files)
    return out


def _walk(out: Outcome, files: dict[str, bytes]) -> None:
    for m in mutations(files, PER_FIELD if out.sampled else None):
        out.tried += 1
        report = verify_files(m.files)
        what = f"{m.file} {m.path} ({m.edit})"
        if report.passed:
            free = free_field(m.file, m.path)
            if free is None:
                out.unexplained.append(what)
            else:
                out.free[f"{free.files} {free.path}"] += 1
            continue
        out.rejected += 1
        said = report.problems + [
            reason
            for result in report.results.values()
            if result["verdict"] == "fail"
            for reason in result["reasons"]
        ]
        # An edit to provenance's plan is named by every observation it no longer matches.
        culprit = m.file.rsplit("/", 1)[-1].removesuffix(".json")
        if not any(m.file in s or culprit in s for s in said) and m.file != schema.PROVENANCE_FILE:
            out.unnamed.append(f"{what}: {said[:2]}")


def test_there_is_a_registered_artifact_to_mutate() -> None:
    assert "artifact" in ARTIFACTS


@pytest.mark.parametrize("name", [*ARTIFACTS, SYNTHETIC])
def test_the_unmutated_artifact_passes(name: str) -> None:
    report = verify_files(_files(name))
    assert report.problems == []
    assert report.passed


@pytest.mark.parametrize("name", [*ARTIFACTS, SYNTHETIC])
def test_every_single_edit_is_refused_unless_the_field_is_free(name: str) -> None:
    out = outcome(name)

    free = sum(out.free.values())
    sampled = f" (each field at most {PER_FIELD} times)" if out.sampled else ""
    print(f"{name}: {out.tried} edits tried{sampled}, {out.rejected} refused, {free} free")
    assert out.tried > 500  # the walk really walked
    assert out.unexplained == [], "\n".join(out.unexplained)
    assert out.unnamed == [], "\n".join(out.unnamed)
    assert out.tried == out.rejected + free


def test_every_free_field_is_really_unchecked() -> None:
    # Each entry must let at least one edit through somewhere; otherwise it is checked now and
    # belongs off the list (and out of docs/evidence.md).
    passed: Counter[str] = Counter()
    for name in [*ARTIFACTS, SYNTHETIC]:
        passed.update(outcome(name).free)
    assert [f"{f.files} {f.path}" for f in FREE_FIELDS if not passed[f"{f.files} {f.path}"]] == []


def test_the_docs_list_exactly_the_free_fields() -> None:
    text = EVIDENCE_PAGE.read_text(encoding="utf-8")
    section = text[text.index("## Free fields") :]
    # To the next section, or the page's end.
    section = section.split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \| (.+) \|$", section, flags=re.M)
    assert [(f, p, r.replace("`", "")) for f, p, r in listed] == [
        (f.files, f.path, f.reason) for f in FREE_FIELDS
    ]
