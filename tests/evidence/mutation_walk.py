"""Single-leaf edits of a real artifact, each resealed as a forger would reseal it.

Every leaf of every JSON file is changed once per applicable edit (an integer +1, a boolean
flipped, a null made 0, a digest, label, float or version altered, a string extended, an enum
swapped for another allowed value), every list loses each item in turn and gains a copy of its
last, every value but the whole record is made null once, and the manifest is recomputed. :func:`dcp_invariant.evidence.verify.verify_files` must
then refuse the artifact unless the leaf is on the free list.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcp_invariant import canonical
from dcp_invariant.evidence import manifest, schema

DATA = Path(__file__).parent.parent / "data"

_HEX64 = re.compile(r"[0-9a-f]{64}")
_LABEL = re.compile(r"([a-z]+)-([0-9]+)")
_FLOAT_HEX = re.compile(r"(-?0x[01]\.)([0-9a-f])(.*)")
_KEY_ENTRY = re.compile(r"(\S+) ([0-9a-f]{64})")  # a fixture run's "<type> <digest>"
_DIGIT = re.compile(r"[0-9]")
# Strings with a closed set of values: the edit a forger would make is the other value.
ENUMS: tuple[tuple[str, ...], ...] = (
    ("127.0.0.1", "torch-default"),
    ("remove", "flip"),
    ("missing", "size", "digest", "unexpected", "not a regular file"),
    ("pass", "fail"),
)


def artifact_dirs() -> list[Path]:
    """Every checked-in artifact: each directory under tests/data with a manifest."""
    return sorted(p.parent for p in DATA.glob("*/" + schema.MANIFEST_FILE))


def read_artifact(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def reseal(files: dict[str, bytes]) -> dict[str, bytes]:
    covered = {rel: data for rel, data in files.items() if rel != schema.MANIFEST_FILE}
    return {**covered, schema.MANIFEST_FILE: manifest.render(covered)}


def string_edits(text: str) -> list[tuple[str, str]]:
    if _HEX64.fullmatch(text):
        return [("digest altered", text[:-1] + ("1" if text[-1] != "1" else "2"))]
    if match := _KEY_ENTRY.fullmatch(text):
        digest = match.group(2)
        return [
            (
                "key digest altered",
                f"{match.group(1)} {digest[:-1]}{'1' if digest[-1] != '1' else '2'}",
            )
        ]
    if match := _LABEL.fullmatch(text):
        return [("label altered", f"{match.group(1)}-{int(match.group(2)) + 1}")]
    if match := _FLOAT_HEX.fullmatch(text):
        head, digit, tail = match.groups()
        return [("float altered", head + ("1" if digit != "1" else "2") + tail)]
    edits = [("string extended", text + "x")]
    digits = [m.start() for m in _DIGIT.finditer(text)]
    for i in dict.fromkeys(digits[:1] + digits[-1:]):  # the first and the last digit
        edits.append(("digit changed", f"{text[:i]}{(int(text[i]) + 1) % 10}{text[i + 1 :]}"))
    for values in ENUMS:
        if text in values:
            edits += [("enum swapped", other) for other in values if other != text]
    return edits


def leaf_edits(value: Any) -> list[tuple[str, Any]]:
    if value is None:
        return [("null made 0", 0)]
    nulled = [("made null", None)]  # what a step that "did not run" records
    if isinstance(value, bool):
        return [("flipped", not value), *nulled]
    if isinstance(value, int):
        return [("+1", value + 1), *nulled]
    if isinstance(value, str):
        return [*string_edits(value), *nulled]
    return nulled  # an object


def list_edits(items: list[Any]) -> list[tuple[str, Any]]:
    if not items:
        return [("item added", ["x"])]
    edits: list[tuple[str, Any]] = [
        (f"item {i} dropped", items[:i] + items[i + 1 :]) for i in range(len(items))
    ]
    return [*edits, ("last item duplicated", [*items, items[-1]]), ("made null", None)]


def shown_path(path: tuple[Any, ...]) -> str:
    """``commit.files[].size``: keys joined by dots, list positions as ``[]``."""
    out = ""
    for part in path:
        out += "[]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass(frozen=True)
class Mutation:
    file: str
    path: str  # shown_path of the edited leaf or list
    edit: str
    files: dict[str, bytes]  # the whole artifact, edited and resealed


def _walk(value: Any, path: tuple[Any, ...]) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(value, dict):
        yield path, value
        for key in sorted(value):
            yield from _walk(value[key], (*path, key))
    elif isinstance(value, list):
        yield path, value
        for i, item in enumerate(value):
            yield from _walk(item, (*path, i))
    else:
        yield path, value


def _replace(root: Any, path: tuple[Any, ...], new: Any) -> Any:
    parent = root
    for part in path[:-1]:
        parent = parent[part]
    old = parent[path[-1]]
    parent[path[-1]] = new
    return old


# The app's objects of one phase (``...objects.final.app.model.0.weight``): one field, whatever
# the attribute. A walk records dozens to thousands of attributes per rank and phase, all held
# to the same comparisons (evidence/object_causes.py), so sampling each attribute as a field
# of its own would only multiply the edits.
_OBJECTS = re.compile(r"(\.objects\.(?:saved|loaded|final))\..*")


def _field(shown: str) -> str:
    return _OBJECTS.sub(r"\1.*", shown)


def count(files: dict[str, bytes]) -> int:
    """How many edits :func:`mutations` would make, without making them."""
    total = 0
    for rel, data in files.items():
        if rel.endswith(".json") and rel != schema.MANIFEST_FILE:
            for path, value in _walk(canonical.loads(data), ()):
                if path:
                    total += len(
                        list_edits(value) if isinstance(value, list) else leaf_edits(value)
                    )
    return total


def mutations(files: dict[str, bytes], per_field: int | None = None) -> Iterator[Mutation]:
    """Every single edit of every JSON file of ``files``, resealed.

    With ``per_field``, each edit of each field (file, path with list positions collapsed) is
    made at most that many times: a fixture run repeats its per-key records for every rank,
    step and arm, all checked by the same comparisons, and would otherwise take minutes.
    """
    covered = {rel: data for rel, data in files.items() if rel != schema.MANIFEST_FILE}
    made: dict[tuple[str, str, str], int] = {}
    for rel in sorted(covered):
        if not rel.endswith(".json"):
            continue
        record = canonical.loads(covered[rel])
        for path, value in list(_walk(record, ())):
            if not path:
                continue
            edits = list_edits(value) if isinstance(value, list) else leaf_edits(value)
            for edit, new in edits:
                field = (rel, _field(shown_path(path)), edit)
                if per_field is not None and made.get(field, 0) >= per_field:
                    continue
                made[field] = made.get(field, 0) + 1
                old = _replace(record, path, new)
                data = canonical.dumps(record)
                _replace(record, path, old)
                if data == covered[rel]:
                    continue
                edited = {**covered, rel: data}
                edited[schema.MANIFEST_FILE] = manifest.render(edited)
                yield Mutation(rel, shown_path(path), edit, edited)
