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

HEX64 = re.compile(r"[0-9a-f]{64}")  # a SHA-256 in the form every record uses


class CanonicalJSONError(ValueError):
    """Bytes that are not one canonical JSON record."""


def dumps(value: Any) -> bytes:
    """Encode ``value`` canonically; floats are refused so no encoder detail leaks into evidence."""
    _refuse_floats(value)
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
        value = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constants)
    except CanonicalJSONError as exc:
        raise CanonicalJSONError(f"{what}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise CanonicalJSONError(f"{what}: not JSON ({exc.msg} at line {exc.lineno})") from exc
    except (ValueError, RecursionError) as exc:
        # Integers past CPython's digit limit, or nesting past the recursion limit.
        raise CanonicalJSONError(
            f"{what}: not a record this tool writes ({type(exc).__name__})"
        ) from exc
    try:
        canonical = dumps(value)
    except (TypeError, ValueError) as exc:
        raise CanonicalJSONError(f"{what}: {exc}") from exc
    if canonical != raw:
        raise CanonicalJSONError(
            f"{what}: not canonical JSON (expected sorted keys, compact separators, one trailing LF)"
        )
    return value


def printable(name: str) -> str:
    """``name`` as is, or its ``ascii()`` form when it holds undecodable bytes (surrogate escapes)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return ascii(name)
    return name


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, val in pairs:
        if key in out:
            raise CanonicalJSONError(f"duplicate key {key!r}")
        out[key] = val
    return out


def _no_constants(name: str) -> Any:
    raise CanonicalJSONError(f"{name} is not allowed in evidence")


def _refuse_floats(value: Any) -> None:
    if isinstance(value, float):
        raise TypeError(
            f"float {value!r} is not allowed in canonical records; encode it as a string"
        )
    if isinstance(value, dict):
        for key, val in value.items():
            if not isinstance(key, str):
                raise TypeError(f"non-string key {key!r}")
            _refuse_floats(val)
    elif isinstance(value, (list, tuple)):
        for val in value:
            _refuse_floats(val)
