"""What a user may give for a fixture, and the one line that says why a value is refused: the
``MODULE:CALLABLE`` spec, its keyword arguments, the rank-local components (standard library
only). The plan (:mod:`dcp_invariant.plan`) holds every run's inputs to these before it records
them beside the evidence, and holds a recorded plan to them again when it is read back."""

from __future__ import annotations

import json
import keyword
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from dcp_invariant import canonical
from dcp_invariant.errors import PlanError

_IDENTIFIERS = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
FIXTURE_SPEC = re.compile(rf"{_IDENTIFIERS}:{_IDENTIFIERS}")
# No importable module has a longer name: each dotted part is a file or directory name (at most
# 255 bytes), and past a few parts the path to it outgrows what the OS opens (PATH_MAX, 4096 on
# Linux), which fails the worker's import with an OSError instead of a missing module.
MAX_FIXTURE_SPEC_CHARS = 1024
# A component is a top-level key of the app's state_dict(); recorded keys are "app.<component>...".
COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")
# The fixture is called as CALLABLE(rank, world_size, **fixture_args).
RESERVED_ARGUMENTS = ("rank", "world_size")
MAX_FIXTURE_ARGS = 32
MAX_FIXTURE_ARGS_BYTES = 4096
# The plan is recorded in provenance.json, whose canonical JSON holds no floats and no integer
# of more than canonical.MAX_INT_DIGITS digits, nested at most canonical.MAX_DEPTH levels in all
# (the record, its plan and fixture_args are three of them): an argument past these would fail
# the run when the artifact is written, or make its artifact one that verify refuses.
MAX_FIXTURE_ARG_DEPTH = 32


def shown_value(value: Any, limit: int = 60) -> str:
    """``repr(value)`` on one line of at most ``limit`` characters, for a message: the Python
    API passes values of any size, and an integer of more digits than
    ``sys.get_int_max_str_digits()`` cannot be converted to text at all (ValueError)."""
    try:
        text = repr(value)
    except ValueError:
        digits = f"more than {sys.get_int_max_str_digits()} digits"
        if isinstance(value, int):
            return f"an integer of {digits}"
        return f"a {type(value).__name__} holding an integer of {digits}"
    text = " ".join(text.split())
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def check_fixture_spec(fixture: Any) -> None:
    if isinstance(fixture, str) and len(fixture) > MAX_FIXTURE_SPEC_CHARS:
        # Named by its start and length: the whole of it would fill the terminal.
        raise PlanError(
            f"fixture {fixture[:40]!r}... is {len(fixture)} characters long, more than a module "
            f"and callable can be named with ({MAX_FIXTURE_SPEC_CHARS}): give MODULE:CALLABLE "
            "of an importable module"
        )
    if not isinstance(fixture, str) or not FIXTURE_SPEC.fullmatch(fixture):
        raise PlanError(
            f"fixture {fixture!r} is not MODULE:CALLABLE (e.g. my_trainer.checks:make_app)"
        )


def fixture_args(given: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    if not isinstance(given, Mapping) or len(given) > MAX_FIXTURE_ARGS:
        raise PlanError(f"fixture arguments: give at most {MAX_FIXTURE_ARGS} NAME=VALUE pairs")
    for name, value in given.items():
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
            raise PlanError(
                f"fixture argument {name!r}: its name must be a Python identifier, e.g. width=64"
            )
        if name in RESERVED_ARGUMENTS:
            raise PlanError(
                f"fixture argument {name}: the tool passes rank and world_size itself; "
                "choose another name"
            )
        problem = _unrecordable(name, value)
        if problem is not None:
            raise PlanError(f"fixture argument {name}: the value must be JSON {problem}")
    if len(json.dumps(dict(given), sort_keys=True)) > MAX_FIXTURE_ARGS_BYTES:
        raise PlanError(f"fixture arguments: more than {MAX_FIXTURE_ARGS_BYTES} bytes of JSON")
    return tuple(sorted(given.items()))


def _unrecordable(name: str, value: Any) -> str | None:
    """Why the evidence cannot record ``value`` exactly, or None: what the plan records must be
    what the fixture got, in canonical JSON (:mod:`dcp_invariant.canonical`).

    Level by level, without recursion, so no nesting can exhaust the stack; integers are bounded
    by comparison, as converting one of thousands of digits to text is what fails.
    """
    level, depth = [value], 0
    while level:
        deeper: list[Any] = []
        containers = False
        for item in level:
            if item is None or isinstance(item, (bool, str)):
                continue
            if isinstance(item, int):
                if abs(item) >= _INT_BOUND:
                    return (
                        f"with integers of at most {canonical.MAX_INT_DIGITS} digits, the most "
                        "the evidence records: pass a longer number as a string"
                    )
                continue
            if isinstance(item, float):
                return (
                    f"without floats ({item!r} is one), which the evidence does not record: pass "
                    f"it as a string ({name}='\"{item!r}\"') and convert it in the fixture"
                )
            if isinstance(item, list):
                deeper += item
            elif isinstance(item, dict) and all(isinstance(k, str) for k in item):
                deeper += item.values()
            else:
                return (
                    "(a number, string, true/false, null, list or object), e.g. width=64 or "
                    "name='\"tiny\"'"
                )
            containers = True
        depth += containers
        if depth > MAX_FIXTURE_ARG_DEPTH:
            return f"nested at most {MAX_FIXTURE_ARG_DEPTH} levels deep"
        level = deeper
    return None


_INT_BOUND = 10**canonical.MAX_INT_DIGITS


def rank_local(given: Sequence[str]) -> tuple[str, ...]:
    names = list(given)
    for name in names:
        if not isinstance(name, str) or not COMPONENT.fullmatch(name):
            raise PlanError(
                f"--rank-local {name!r}: give a top-level key of the app's state_dict(), "
                "e.g. --rank-local data"
            )
    if len(set(names)) != len(names):
        raise PlanError(f"--rank-local {names}: each component once")
    return tuple(sorted(names))


# An attribute of the app's objects, or a global RNG, as the reasons name them
# (dcp_invariant/ranks/app_objects.py): app.ema, app.scaler._scale, rng.numpy.
ATTRIBUTE_PATH = re.compile(r"(app|rng)(\.[A-Za-z0-9_~\-]{1,64}){1,16}")
MAX_IGNORED_ATTRS = 64


def ignored_attrs(given: Sequence[str]) -> tuple[str, ...]:
    paths = list(given)
    for path in paths:
        if not isinstance(path, str) or not ATTRIBUTE_PATH.fullmatch(path):
            raise PlanError(
                f"--ignore-attr {shown_value(path)}: give an attribute path as a reason names it, "
                "e.g. --ignore-attr app.ema or --ignore-attr rng.numpy"
            )
    if len(set(paths)) != len(paths) or len(paths) > MAX_IGNORED_ATTRS:
        raise PlanError(
            f"--ignore-attr {shown_value(paths, 200)}: each path once, at most {MAX_IGNORED_ATTRS}"
        )
    return tuple(sorted(paths))


def positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
