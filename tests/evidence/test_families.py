"""One module a family: every planned family has its evidence record, and no evidence code names
a family to branch on it."""

from __future__ import annotations

import ast
from itertools import pairwise
from pathlib import Path
from typing import Any, get_args, get_type_hints

import pytest

from dcp_invariant import plan
from dcp_invariant.evidence import families
from dcp_invariant.evidence.checks import Record, json_object
from dcp_invariant.evidence.families import FAMILIES, records
from dcp_invariant.evidence.families import _record_parts as record_parts

EVIDENCE = Path(families.__file__).parent.parent
MEMBERS = ("shape_for", "rule", "commits", "sightings")
PLANS = (plan.REGISTERED, plan.fixture_plan("m:f", (1, 2)))


def test_every_planned_family_has_a_registry_entry_with_every_member() -> None:
    assert set(FAMILIES) == set(plan.FAMILIES)
    for family, record in FAMILIES.items():
        for member in MEMBERS:
            assert callable(getattr(record, member, None)), (family, member)


@pytest.mark.parametrize("run_plan", PLANS, ids=lambda p: p.kind)
def test_each_planned_scenario_has_a_shape_and_labelled_commits(run_plan: plan.Plan) -> None:
    for scenario in run_plan.scenarios:
        record = FAMILIES[scenario.family]
        assert callable(record.shape_for(run_plan)), scenario.name
        commits = record.commits(run_plan)
        assert commits, scenario.name
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in commits), scenario.name


def _names_family(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id.endswith("family")
    return isinstance(node, ast.Attribute) and node.attr.endswith("family")


def _is_literal(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(_is_literal(e) for e in node.elts)
    return False


def _family_literal_comparisons(source: str) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        sides = [node.left, *node.comparators]
        for a, b in pairwise(sides):
            if (_names_family(a) and _is_literal(b)) or (_names_family(b) and _is_literal(a)):
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize(
    "path", sorted(EVIDENCE.rglob("*.py")), ids=lambda p: str(p.relative_to(EVIDENCE))
)
def test_no_evidence_module_branches_on_a_family_name(path: Path) -> None:
    found = _family_literal_comparisons(path.read_text(encoding="utf-8"))
    assert not found, f"{path}: compares a family with a literal at lines {found}"


@pytest.mark.parametrize(
    "source",
    [
        'if scenario.family == "reshard": pass',
        'if family in ("resume", "reshard"): pass',
        'x = "dtensor" != run_plan.scenario(name).family',
    ],
)
def test_the_check_finds_a_family_name_branch(source: str) -> None:
    assert _family_literal_comparisons(source) == [1]


# --- the typed record parts and the shapes they mirror -----------------------------------------


@pytest.mark.parametrize(
    ("typed", "shape"),
    [
        (records.CommitRecord, record_parts.commit),
        (records.GroupRecord, record_parts.group(json_object)),
        (records.FileSize, record_parts.file_size),
        (records.FailureRecord, record_parts.failure),
        (records.CutRecord, record_parts.cut),
    ],
    ids=["commit", "group", "file_size", "failure", "cut"],
)
def test_a_typed_record_part_has_exactly_the_keys_its_shape_requires(
    typed: Any, shape: Record
) -> None:
    # What the driver builds (mypy checks it against the TypedDict) is what the verifier then
    # requires (the shape): a key added to one and not the other would fail every artifact.
    # NotRequired keys are the shape's omissible ones.
    assert set(typed.__required_keys__) == shape.names
    assert set(typed.__optional_keys__) == shape.omissible


def test_the_observation_base_is_what_every_family_shares() -> None:
    base = set(get_type_hints(records.ObservationBase))
    assert base == set(record_parts.common_fields)
    for run_plan in PLANS:
        for scenario in run_plan.scenarios:
            shape = FAMILIES[scenario.family].shape_for(run_plan)
            assert isinstance(shape, Record), scenario.name
            assert base <= shape.names, scenario.name


def test_a_failure_reason_is_one_the_plan_names() -> None:
    reason = get_type_hints(records.FailureRecord)["reason"]
    assert get_args(reason) == plan.FAILURE_REASONS


def test_no_family_module_imports_another_ones_private_names() -> None:
    for path in sorted(Path(families.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "dcp_invariant."
            ):
                private = [a.name for a in node.names if a.name.startswith("_")]
                assert not private, f"{path.name} imports {private} from {node.module}"
