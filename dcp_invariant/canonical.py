"""Canonical JSON: the one byte encoding every evidence record, receipt and pointer uses.

A record is canonical when it equals ``dumps(loads(raw))`` byte for byte: UTF-8, keys sorted,
compact separators, no NaN/Infinity, exactly one trailing LF. Parsing is strict so that two
different byte strings can never be accepted as the same record.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from dcp_invariant.errors import Error

HEX64 = re.compile(r"[0-9a-f]{64}")  # a SHA-256 in the form every record uses
# No record this tool writes nests deeper than a dozen levels or holds an integer of more than
# 20 digits (a 64-bit size has at most 20).
# The bounds are checked before anything recurses or converts: CPython's json encoder and
# float check recurse once per level (a list nested ~990 deep parses but cannot be re-encoded),
# and int() is quadratic in the digits when PYTHONINTMAXSTRDIGITS=0 lifts CPython's own limit
# (https://docs.python.org/3/library/stdtypes.html#int-max-str-digits).
MAX_DEPTH = 64
MAX_INT_DIGITS = 20


class CanonicalJSONError(Error, ValueError):
    """Bytes that are not one canonical JSON record."""


def dumps(value: Any) -> bytes:
    """Encode ``value`` canonically; floats are refused so no encoder detail leaks into evidence."""
    _refuse_floats(value)
    return _encode(value)


def _encode(value: Any) -> bytes:
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8") + b"\n"


def digest(value: Any) -> str:
    """SHA-256 hex of the canonical encoding."""
    return hashlib.sha256(dumps(value)).hexdigest()


def loads(raw: bytes, *, what: str = "record") -> Any:
    """Parse strictly and require ``raw`` to be the canonical encoding of what it parses to."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CanonicalJSONError(f"{what}: not valid UTF-8 (byte {exc.start})") from exc
    try:
        value = json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constants,
            parse_int=_bounded_int,
            parse_float=_no_floats,
        )
    except CanonicalJSONError as exc:
        raise CanonicalJSONError(f"{what}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise CanonicalJSONError(f"{what}: not JSON ({exc.msg} at line {exc.lineno})") from exc
    except RecursionError as exc:  # the C scanner's own guard, far past MAX_DEPTH
        raise CanonicalJSONError(f"{what}: nested more than {MAX_DEPTH} levels deep") from exc
    except ValueError as exc:  # any other refusal of the parser
        raise CanonicalJSONError(f"{what}: not JSON ({exc})") from exc
    if nesting_depth(value) > MAX_DEPTH:
        raise CanonicalJSONError(f"{what}: nested more than {MAX_DEPTH} levels deep")
    try:
        canonical = _encode(value)  # no float can have been parsed: _no_floats refused it
    except (TypeError, ValueError) as exc:
        raise CanonicalJSONError(f"{what}: {exc}") from exc
    except RecursionError as exc:  # unreachable below MAX_DEPTH; kept so nothing escapes
        raise CanonicalJSONError(f"{what}: too deeply nested to re-encode") from exc
    if canonical != raw:
        raise CanonicalJSONError(
            f"{what}: not canonical JSON (expected sorted keys, compact separators, one trailing LF)"
        )
    return value


def nesting_depth(value: Any) -> int:
    """How many lists and objects deep ``value`` goes (counting stops past MAX_DEPTH).

    Level by level, without recursion, so no depth can exhaust the stack.
    """
    level = [value] if type(value) in _CONTAINERS else []
    depth = 0
    while level and depth <= MAX_DEPTH:
        depth += 1
        deeper: list[Any] = []
        for item in level:
            children = item.values() if type(item) is dict else item
            deeper += [child for child in children if type(child) in _CONTAINERS]
        level = deeper
    return depth


_CONTAINERS = (dict, list)


def printable(name: str) -> str:
    """``name`` as is, or its ``ascii()`` form when it holds undecodable bytes (surrogate escapes)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return ascii(name)
    return name


def shown(text: str) -> str:
    """``text`` safe for one line of output: control characters and undecodable bytes escaped.

    Paths and names come from the artifact (a hostile one may hold a newline in a file name),
    and every problem must stay one line.
    """
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if "\udc80" <= char <= "\udcff":  # os.fsdecode's stand-in for an undecodable byte
        return f"\\x{ord(char) - 0xDC00:02x}"
    return ascii(char)[1:-1]


_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


def _bounded_int(digits: str) -> int:
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise CanonicalJSONError(
            f"an integer of {len(digits.lstrip('-'))} digits (at most {MAX_INT_DIGITS})"
        )
    return int(digits)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, val in pairs:
        if key in out:
            raise CanonicalJSONError(f"duplicate key {key!r}")
        out[key] = val
    return out


def _no_floats(literal: str) -> Any:
    raise CanonicalJSONError(
        f"float {literal} is not allowed in canonical records; encode it as a string"
    )


def _no_constants(name: str) -> Any:
    raise CanonicalJSONError(f"{name} is not allowed in evidence")


def _refuse_floats(value: Any) -> None:
    # Iterative: a value nested past the recursion limit is refused for its floats, not crashed on.
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is str or kind is int or kind is bool or item is None:
            continue
        if isinstance(item, float):
            raise TypeError(
                f"float {item!r} is not allowed in canonical records; encode it as a string"
            )
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, str):
                    raise TypeError(f"non-string key {key!r}")
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
