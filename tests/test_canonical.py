"""Canonical JSON: one byte string per record, and nothing else accepted."""

from __future__ import annotations

import hashlib

import pytest

from dcp_invariant import canonical
from dcp_invariant.canonical import CanonicalJSONError


def test_dumps_is_sorted_compact_and_lf_terminated() -> None:
    assert canonical.dumps({"b": [1, {"d": None, "c": True}], "a": "x"}) == (
        b'{"a":"x","b":[1,{"c":true,"d":null}]}\n'
    )


def test_dumps_keeps_non_ascii_as_utf8() -> None:
    # Escaping to \uXXXX would give a second byte form of the same text.
    assert canonical.dumps({"k": "étape ✓"}) == '{"k":"étape ✓"}\n'.encode()


@pytest.mark.parametrize(
    "value",
    [1.5, 0.0, {"a": 1.0}, [1, [2, {"x": float("nan")}]], {"a": {"b": (3, 2.5)}}],
    ids=["top", "zero", "in-dict", "deep-nan", "in-tuple"],
)
def test_dumps_refuses_floats(value: object) -> None:
    with pytest.raises(TypeError, match="float"):
        canonical.dumps(value)


@pytest.mark.parametrize("value", [{1: "a"}, {"ok": {None: 1}}, [{True: 1}]])
def test_dumps_refuses_non_string_keys(value: object) -> None:
    # json.dumps would silently turn 1 into "1", so two inputs would share one encoding.
    with pytest.raises(TypeError, match="non-string key"):
        canonical.dumps(value)


@pytest.mark.parametrize(
    "value",
    [
        {},
        [],
        0,
        -7,
        10**19,
        -(10**19),
        "",
        None,
        False,
        {"z": [{"é": "ü", "a": [None, True]}], "a": -1},
    ],
)
def test_loads_round_trips_dumps(value: object) -> None:
    assert canonical.loads(canonical.dumps(value)) == value


REJECTED = [
    ("unsorted keys", b'{"b":1,"a":2}\n', "not canonical"),
    ("space after colon", b'{"a": 1}\n', "not canonical"),
    ("space after comma", b'{"a":1, "b":2}\n', "not canonical"),
    ("leading space", b' {"a":1}\n', "not canonical"),
    ("no trailing LF", b'{"a":1}', "not canonical"),
    ("CRLF", b'{"a":1}\r\n', "not canonical"),
    ("two trailing LFs", b'{"a":1}\n\n', "not canonical"),
    ("escaped non-ASCII", b'{"a":"\\u00e9"}\n', "not canonical"),
    ("duplicate key", b'{"a":1,"a":1}\n', "duplicate key 'a'"),
    ("nested duplicate key", b'{"a":{"b":1,"b":2}}\n', "duplicate key 'b'"),
    ("NaN", b'{"a":NaN}\n', "NaN is not allowed"),
    ("Infinity", b"[Infinity]\n", "Infinity is not allowed"),
    ("-Infinity", b"[-Infinity]\n", "-Infinity is not allowed"),
    ("invalid UTF-8", b'{"a":"\xff"}\n', "not valid UTF-8"),
    ("BOM", b'\xef\xbb\xbf{"a":1}\n', "not JSON"),
    ("not JSON", b"{a:1}\n", "not JSON"),
    ("empty", b"", "not JSON"),
    ("float value", b'{"a":1.5}\n', "float"),
    ("integral float", b'{"a":1.0}\n', "float"),
    ("exponent", b'{"a":1e3}\n', "float"),
]


@pytest.mark.parametrize(
    ("raw", "problem"), [r[1:] for r in REJECTED], ids=[r[0] for r in REJECTED]
)
def test_loads_rejects_non_canonical_bytes(raw: bytes, problem: str) -> None:
    with pytest.raises(CanonicalJSONError) as info:
        canonical.loads(raw, what="pointer.json")
    message = str(info.value)
    assert message.startswith("pointer.json: ")
    assert problem in message


@pytest.mark.parametrize(
    "raw",
    [
        # Python refuses to parse an int of more than 4300 digits with a plain ValueError.
        b"1" * 5000 + b"\n",
        # The C scanner gives up on deep nesting with RecursionError.
        b"[" * 100_000,
    ],
    ids=["huge-int", "deep-nesting"],
)
def test_loads_reports_every_parse_failure_as_canonical_json_error(raw: bytes) -> None:
    with pytest.raises(CanonicalJSONError, match=r"^receipt: "):
        canonical.loads(raw, what="receipt")


@pytest.mark.parametrize("value", [{"b": 2, "a": [1, "é"]}, [], "x", 0])
def test_digest_is_sha256_of_dumps(value: object) -> None:
    assert canonical.digest(value) == hashlib.sha256(canonical.dumps(value)).hexdigest()


def test_digest_distinguishes_values_that_differ_only_in_type() -> None:
    assert canonical.digest({"a": 1}) != canonical.digest({"a": "1"})


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("observations/x.json", "observations/x.json"),
        ("étape ✓", "étape ✓"),  # printable non-ASCII stays as it is
        ("a\nb\rc\x1b[31m", "a\\nb\\rc\\x1b[31m"),
        ("name-\udcff", "name-\\xff"),  # an undecodable byte, as os.fsdecode keeps it
        ("\u2028\x7f\ud800", "\\u2028\\x7f\\ud800"),
    ],
)
def test_shown_keeps_a_name_on_one_printable_line(text: str, shown: str) -> None:
    assert canonical.shown(text) == shown
