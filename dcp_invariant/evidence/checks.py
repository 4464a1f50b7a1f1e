"""Validators for decoded JSON records: each takes a value and where it sits, returns problems.

The building blocks the observation and provenance shapes are made of; no evidence-specific
knowledge lives here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

Check = Callable[[Any, str], list[str]]


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def string(value: Any, where: str) -> list[str]:
    return [] if isinstance(value, str) else [f"{where}: expected a string, got {type_name(value)}"]


def boolean(value: Any, where: str) -> list[str]:
    return (
        [] if isinstance(value, bool) else [f"{where}: expected true/false, got {type_name(value)}"]
    )


def integer(minimum: int | None = None) -> Check:
    def check(value: Any, where: str) -> list[str]:
        if not isinstance(value, int) or isinstance(value, bool):
            return [f"{where}: expected an integer, got {type_name(value)}"]
        if minimum is not None and value < minimum:
            return [f"{where}: expected an integer >= {minimum}, got {value}"]
        return []

    return check


def pattern(regex: re.Pattern[str], what: str) -> Check:
    def check(value: Any, where: str) -> list[str]:
        if isinstance(value, str) and regex.fullmatch(value):
            return []
        return [f"{where}: expected {what}, got {value!r}"]

    return check


def label(kind: str) -> Check:
    return pattern(re.compile(rf"{kind}-[1-9][0-9]{{0,3}}"), f"a {kind} label like '{kind}-1'")


def one_of(*values: Any) -> Check:
    def check(value: Any, where: str) -> list[str]:
        # Type-exact: JSON true must not pass for 1, nor 0 for false.
        if any(type(value) is type(v) and value == v for v in values):
            return []
        return [f"{where}: expected one of {list(values)}, got {value!r}"]

    return check


def optional(inner: Check) -> Check:
    def check(value: Any, where: str) -> list[str]:
        return [] if value is None else inner(value, where)

    return check


def list_of(inner: Check, max_items: int = 64) -> Check:
    def check(value: Any, where: str) -> list[str]:
        if not isinstance(value, list):
            return [f"{where}: expected a list, got {type_name(value)}"]
        if len(value) > max_items:
            return [f"{where}: more than {max_items} items"]
        problems: list[str] = []
        for i, item in enumerate(value):
            problems += inner(item, f"{where}[{i}]")
        return problems

    return check


class Record:
    """The check :func:`record` makes. Its ``names`` stay readable, so a typed mirror of the
    record (a TypedDict the code that builds it uses) can be held to exactly these keys."""

    def __init__(self, fields: dict[str, Check], omissible: dict[str, Check] | None = None) -> None:
        self.names = frozenset(fields)
        # Keys a record may leave out (written only when they say something).
        self.omissible = frozenset(omissible or {})
        self._ordered = sorted({**fields, **(omissible or {})}.items())

    def __call__(self, value: Any, where: str) -> list[str]:
        if not isinstance(value, dict):
            return [f"{where}: expected an object, got {type_name(value)}"]
        problems: list[str] = []
        names = self.names
        if value.keys() - self.omissible != names:
            problems += [f"{where}: missing key {k!r}" for k in sorted(names - value.keys())]
            unknown = value.keys() - names - self.omissible
            problems += [f"{where}: unknown key {k!r}" for k in sorted(unknown)]
        for key, inner in self._ordered:
            if key in value:
                problems += inner(value[key], f"{where}.{key}")
        return problems


def record(**fields: Check) -> Record:
    return Record(fields)


def record_omitting(omissible: dict[str, Check], **fields: Check) -> Record:
    """A record of ``fields``, which may also hold any of ``omissible``."""
    return Record(fields, omissible)


def json_object(value: Any, where: str) -> list[str]:
    """An object of decoded JSON values; what they mean is checked by whoever reads them."""
    if not isinstance(value, dict):
        return [f"{where}: expected an object, got {type_name(value)}"]
    return []
