"""The parts observation records are built of, shared by the families' shapes.

Run-varying digests (receipts and pointers: DCP's ``.metadata`` carries a fresh UUID per save)
are recorded as labels like ``receipt-1`` in order of first appearance, so equal labels mean
equal digests and two runs produce identical bytes.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from dcp_invariant import canonical, dcp_layout, plan
from dcp_invariant.evidence import schema
from dcp_invariant.evidence.checks import (
    Check,
    Record,
    boolean,
    integer,
    label,
    list_of,
    one_of,
    optional,
    pattern,
    record,
    record_omitting,
    string,
    type_name,
)

# An observation record whose shape was checked. The parts :mod:`.records` types (a commit, a
# group) are read through their TypedDicts; the rest, whose keys vary by family, as plain dicts.
Obs = dict[str, Any]

_FLOAT_HEX = re.compile(r"-?0x[01]\.[0-9a-f]+p[+-]\d+|-?inf|nan")

_COMPONENT = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


AGGREGATE = "aggregate"


def aggregate(components: dict[str, str]) -> str:
    """The ``aggregate`` a worker adds to its component digests, derived again here.

    Workers compute it as ``canonical.digest(sorted(component items))``
    (:func:`dcp_invariant.ranks.digest.component_digests`): a digest over the others, so it is
    re-derived rather than trusted.
    """
    return _aggregate(tuple(sorted((k, v) for k, v in components.items() if k != AGGREGATE)))


@functools.lru_cache(maxsize=1024)  # an artifact repeats the same few states many times
def _aggregate(items: tuple[tuple[str, str], ...]) -> str:
    return canonical.digest(items)


def digests(value: Any, where: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where}: expected an object of component digests, got {type_name(value)}"]
    problems = [] if AGGREGATE in value else [f"{where}: missing key 'aggregate'"]
    if len(value) > 65:
        problems.append(f"{where}: more than 64 components")
    for key in sorted(value):
        if not _COMPONENT.fullmatch(key):
            problems.append(f"{where}: invalid component name {key!r}")
        problems += pattern(canonical.HEX64, "a 64-hex digest")(value[key], f"{where}.{key}")
    if not problems and value[AGGREGATE] != aggregate(value):
        problems.append(f"{where}.aggregate: is not the digest of the other components")
    return problems


hex64 = pattern(canonical.HEX64, "a 64-hex digest")

float_hex = pattern(_FLOAT_HEX, "a float in float.hex() form")

exit_code = integer()

shape = list_of(integer(0), max_items=8)

step = record(loss=float_hex, digests=digests)

# The shapes records.FailureRecord, records.FileSize, records.CommitRecord, records.GroupRecord
# and records.ObservationBase mirror, key for key.
failure = record(path=string, reason=one_of(*plan.FAILURE_REASONS))

file_size = record(path=string, size=integer(0))

commit = record(
    label=string,
    sealed=boolean,
    seal_error=optional(string),
    receipt=optional(label("receipt")),
    files=list_of(file_size, dcp_layout.MAX_FILES),
    promoted=boolean,
    refused=list_of(failure),
    candidate_retained=boolean,
    pointer_before=optional(label("pointer")),
    pointer_after=optional(label("pointer")),
    generations_before=integer(0),
    generations_after=integer(0),
)

cut = record(
    kept=list_of(string, dcp_layout.MAX_FILES),
    truncated=string,
    left_out=list_of(string, dcp_layout.MAX_FILES),
)

# What a rank reports after resolving the pointer and (if verification passed) loading.
load_fields: dict[str, Check] = {
    "rank": integer(0),
    "generation": optional(label("receipt")),
    "verified_before_load": boolean,
    "verified_after_load": boolean,
    "refused": list_of(failure),
}


# A Python class name, as the user's code raised it (an exception's type, never its message).
_TYPE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")

raised = record(
    rank=integer(0),
    method=one_of(*plan.APP_METHODS),
    exception=pattern(_TYPE_NAME, "a Python class name"),
)


def group(rank_record: Check) -> Record:
    return record_omitting(
        {"raised": list_of(raised, 8), "unfinished": list_of(integer(0), 8)},
        exit_codes=list_of(exit_code, 8),
        timed_out=boolean,
        ranks=list_of(rank_record, 8),
    )


common_fields: dict[str, Check] = {
    "schema_version": one_of(*schema.VERSIONS),
    "scenario": string,
    "source_world_size": integer(1),
    "target_world_size": integer(1),
    "errors": list_of(string),
}


def always(shape: Check) -> Callable[[plan.Plan], Check]:
    """The ``shape_for`` of a family whose record has one shape in every plan."""
    return lambda run_plan: shape
