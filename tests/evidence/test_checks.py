"""The generic record validators the observation and provenance shapes are built from."""

from __future__ import annotations

from typing import Any

import pytest

from dcp_invariant.evidence import checks


@pytest.mark.parametrize(
    ("allowed", "value", "ok"),
    [
        (1, 1, True),
        (1, True, False),  # JSON true must not pass for 1
        (False, False, True),
        (False, 0, False),  # nor 0 for false
        (2, 2.0, False),
        ("flip", "flip", True),
        ("flip", "Flip", False),
    ],
)
def test_one_of_is_type_exact(allowed: Any, value: Any, ok: bool) -> None:
    assert (checks.one_of(allowed)(value, "x") == []) is ok


def test_record_names_missing_and_unknown_keys() -> None:
    check = checks.record(a=checks.string, b=checks.integer(0))
    assert check({"a": "x", "c": 1}, "r") == ["r: missing key 'b'", "r: unknown key 'c'"]
    assert check({"a": "x", "b": -1}, "r") == ["r.b: expected an integer >= 0, got -1"]


def test_list_of_bounds_its_length() -> None:
    check = checks.list_of(checks.string, max_items=2)
    assert check(["a", "b"], "l") == []
    assert check(["a", "b", "c"], "l") == ["l: more than 2 items"]
    assert check(["a", 1], "l") == ["l[1]: expected a string, got int"]
