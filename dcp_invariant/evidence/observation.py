"""The shape of every observation record, defined once and checked by the verifier.

The runner builds observations as plain dicts; this module says which keys and types each
scenario family's record must have. A record of the wrong shape makes the artifact invalid; a
record of the right shape is then judged by :mod:`dcp_invariant.evidence.rules`.

Run-varying digests (receipts and pointers: DCP's ``.metadata`` carries a fresh UUID per save)
are recorded as labels like ``receipt-1`` in order of first appearance, so equal labels mean
equal digests and two runs produce identical bytes.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from dcp_invariant import canonical, plan
from dcp_invariant.evidence import diagnosis, schema
from dcp_invariant.evidence.checks import (
    Check,
    boolean,
    integer,
    label,
    list_of,
    one_of,
    optional,
    pattern,
    record,
    string,
    type_name,
)

_FLOAT_HEX = re.compile(r"-?0x[01]\.[0-9a-f]+p[+-]\d+|-?inf|nan")
_COMPONENT = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


AGGREGATE = "aggregate"


def aggregate(components: dict[str, str]) -> str:
    """The ``aggregate`` a worker adds to its component digests, derived again here.

    Workers compute it as ``canonical.digest(sorted(component items))``
    (:func:`dcp_invariant.suite.digest.component_digests`): a digest over the others, so it is
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
failure = record(path=string, reason=one_of(*plan.FAILURE_REASONS))
file_size = record(path=string, size=integer(0))

commit = record(
    label=string,
    sealed=boolean,
    seal_error=optional(string),
    receipt=optional(label("receipt")),
    files=list_of(file_size),
    promoted=boolean,
    refused=list_of(failure),
    candidate_retained=boolean,
    pointer_before=optional(label("pointer")),
    pointer_after=optional(label("pointer")),
    generations_before=integer(0),
    generations_after=integer(0),
)

# What a rank reports after resolving the pointer and (if verification passed) loading.
_load_fields: dict[str, Check] = {
    "rank": integer(0),
    "generation": optional(label("receipt")),
    "verified_before_load": boolean,
    "verified_after_load": boolean,
    "refused": list_of(failure),
}

training_source_rank = record(rank=integer(0), saves=list_of(digests, 4), next=optional(step))
training_target_rank = record(**_load_fields, loaded=optional(digests), next=optional(step))
elastic_target_rank = record(
    **_load_fields,
    loaded=optional(digests),
    next=optional(step),
    restart_count=integer(0),
    max_restarts=integer(0),
    master_addr_loopback=boolean,
)
dtensor_source_rank = record(rank=integer(0), local_shape=shape, global_digest=hex64)
dtensor_target_rank = record(
    **_load_fields, local_shape=optional(shape), global_digest=optional(hex64)
)


def group(rank_record: Check) -> Check:
    return record(
        exit_codes=list_of(exit_code, 8), timed_out=boolean, ranks=list_of(rank_record, 8)
    )


attestation = record(
    create_tcp_store_bytes=integer(0),
    create_tcp_store_sha256=hex64,
    listen=one_of("127.0.0.1", "torch-default"),
    shared_rendezvous_store_disabled=boolean,
    stores_built=integer(0),
    tcp_store_pristine=boolean,
    torch_distribution=string,
    torch_runtime=string,
    use_libuv=boolean,
)

_common: dict[str, Check] = {
    "schema_version": one_of(schema.SCHEMA_VERSION, schema.FIXTURE_SCHEMA_VERSION),
    "scenario": string,
    "source_world_size": integer(1),
    "target_world_size": integer(1),
    "errors": list_of(string),
}

# A fixture run's per-key records: {"app.model.weight": "float32[4,2] <sha256>", ...}.
_KEY_PATH = re.compile(r"[^\x00-\x1f]{1,1024}")
_MAX_KEYS = 20_000


def key_records(value: Any, where: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{where}: expected an object of per-key records, got {type_name(value)}"]
    if len(value) > _MAX_KEYS:
        return [f"{where}: more than {_MAX_KEYS} keys"]
    problems = []
    for key, entry in value.items():
        if not _KEY_PATH.fullmatch(key):
            problems.append(f"{where}: invalid key path {key!r}")
        elif not isinstance(entry, str) or not diagnosis.KEY_ENTRY.fullmatch(entry):
            problems.append(f"{where}.{key}: expected '<type> <64-hex digest>', got {entry!r}")
    return problems


_steps = list_of(record(keys=key_records, loss=float_hex), plan.MAX_STEPS)
# What a rank of an arm that trained N steps, saved and took K more reports.
_train_fields: dict[str, Check] = {
    "rank": integer(0),
    "losses_before": list_of(float_hex, plan.MAX_STEPS),
    "saved": optional(key_records),
    "steps": _steps,
}
fixture_train_rank = record(**_train_fields)
fixture_resume_rank = record(
    **_load_fields,
    loaded=optional(key_records),
    load_error=optional(
        record(kind=one_of(*plan.LOAD_FAILURES), key=optional(string), exception=optional(string))
    ),
    steps=_steps,
    diffs=list_of(
        record(key=string, max_abs_diff=optional(float_hex), phase=string),
        32 * (plan.MAX_STEPS + 1),
    ),
)
# An async save's own facts: the next step overlapped the write, and the write's outcome.
async_train_rank = record(
    **_train_fields,
    **{
        "async": record(
            pending_during_step=boolean, staged_first=boolean, upload_error=optional(string)
        )
    },
)


def left_running(value: Any, where: str) -> list[str]:
    """What a fixture run's groups left running: ``[{"group": ..., "programs": [...]}]``, one
    entry per group in name order, each program list sorted (the runner kills them all)."""
    problems = list_of(record(group=string, programs=list_of(string, 64)), 64)(value, where)
    if problems:
        return problems
    groups = [entry["group"] for entry in value]
    if groups != sorted(set(groups)):
        problems.append(f"{where}: expected one entry per group, in name order")
    for i, entry in enumerate(value):
        if not entry["programs"] or entry["programs"] != sorted(entry["programs"]):
            problems.append(f"{where}[{i}].programs: expected a non-empty sorted list")
    return problems


_fixture_common: dict[str, Check] = {
    **_common,
    "left_running": left_running,
    "fixture": string,
    "steps_before_save": integer(1),
    "steps_after": integer(1),
    "commit": optional(commit),
    "target": optional(group(fixture_resume_rank)),
}

_elastic_fields: dict[str, Check] = {
    **_common,
    "fixture": string,
    "steps_before_save": integer(0),
    "source": group(training_source_rank),
    "commit": optional(commit),
    "launcher": optional(
        record(
            arguments=list_of(string, 16),
            exit_code=exit_code,
            timed_out=boolean,
            guard=optional(attestation),
        )
    ),
    "failure_marker": optional(record(attempt=integer(0), exit_code=exit_code, rank=integer(0))),
    "target": optional(record(ranks=list_of(elastic_target_rank, 8))),
    "after": optional(
        record(
            pointer=optional(label("pointer")),
            receipt=optional(label("receipt")),
            generations=integer(0),
        )
    ),
}

FAMILY_SHAPES: dict[str, Check] = {
    "resume": record(
        **_fixture_common,
        reference=optional(group(fixture_train_rank)),
        repeat=optional(group(fixture_train_rank)),
    ),
    "reshard": record(
        **_fixture_common, source=group(fixture_train_rank), left_out=list_of(string, 64)
    ),
    "async_resume": record(
        **_fixture_common,
        save_mode=one_of("thread", "staged", "process"),
        reference=optional(group(async_train_rank)),
        repeat=optional(group(async_train_rank)),
    ),
    "training": record(
        **_common,
        fixture=string,
        steps_before_save=integer(0),
        source=group(training_source_rank),
        commit=optional(commit),
        target=optional(group(training_target_rank)),
    ),
    "dtensor": record(
        **_common,
        global_shape=shape,
        placement=string,
        dtype=string,
        source=group(dtensor_source_rank),
        commit=optional(commit),
        target=optional(group(dtensor_target_rank)),
    ),
    "elastic": record(**_elastic_fields),
    "rank_exit": record(
        **_common,
        fixture=string,
        steps_before_save=integer(0),
        dying_rank=integer(0),
        planned_exit_code=exit_code,
        source=group(training_source_rank),
        baseline=optional(commit),
        candidate=optional(commit),
        load_attempted=boolean,
    ),
    "damaged": record(
        **_common,
        fixture=string,
        steps_before_save=integer(0),
        damage=record(kind=one_of("remove", "flip"), path=string, offset=optional(integer(0))),
        source=group(training_source_rank),
        baseline=optional(commit),
        candidate=optional(commit),
        load_attempted=boolean,
    ),
}

# The elastic scenario of a fixture run records, like the other fixture families, what its groups
# (torchrun's ranks among them) left running.
FIXTURE_ELASTIC = record(**_elastic_fields, left_running=left_running)


def shape_of(family: str, run_plan: plan.Plan) -> Check:
    if run_plan.kind == "fixture" and family == "elastic":
        return FIXTURE_ELASTIC
    return FAMILY_SHAPES[family]


def validate(name: str, observation: Any, *, run_plan: plan.Plan) -> list[str]:
    """Every way ``observation`` departs from the shape of scenario ``name``; empty when valid."""
    scenario = run_plan.scenario(name)
    problems = shape_of(scenario.family, run_plan)(observation, name)
    if problems:
        return problems
    planned: list[tuple[str, Any]] = [
        ("scenario", scenario.name),
        ("schema_version", schema.version_for(run_plan)),
        ("source_world_size", scenario.source_world_size),
        ("target_world_size", scenario.target_world_size),
    ]
    # The registered suite's damage and dtensor records carry no fixture or step counts.
    for key, value in (
        ("fixture", run_plan.fixture),
        ("steps_before_save", run_plan.steps_before),
        ("steps_after", run_plan.steps_after),
    ):
        if key in observation:
            planned.append((key, value))
    for where, _, checkpoint in _commits(scenario, observation, run_plan):
        planned.append((f"{where}.label", checkpoint))
    for key, expected in planned:
        got = _at(observation, key)
        if got != expected:
            problems.append(f"{name}.{key}: expected {expected!r}, got {got!r}")
    return problems + _label_order(name, scenario, observation, run_plan)


def _at(record: dict[str, Any], dotted: str) -> Any:
    for key in dotted.split("."):
        record = record[key]
    return record


def _commits(
    scenario: plan.Scenario, obs: dict[str, Any], run_plan: plan.Plan
) -> list[tuple[str, dict[str, Any], str]]:
    """Each commit the scenario's driver made, in order, with the checkpoint label it used."""
    if scenario.family in ("rank_exit", "damaged"):
        steps = [("baseline", run_plan.baseline_label), ("candidate", run_plan.candidate_label)]
    elif scenario.family == "dtensor":
        steps = [("commit", plan.DTENSOR_LABEL)]
    else:
        steps = [("commit", run_plan.baseline_label)]
    return [(key, obs[key], label) for key, label in steps if obs[key] is not None]


def _label_order(
    name: str, scenario: plan.Scenario, obs: dict[str, Any], run_plan: plan.Plan
) -> list[str]:
    """Receipt and pointer labels must be numbered in the order the driver first met each digest.

    The driver's interner (``Interner`` in dcp_invariant/suite/scenarios/common.py) hands out
    ``<kind>-1``, ``<kind>-2``, ... per scenario as digests first appear: for each commit the
    pointer before, the receipt, the pointer after; then each loading rank's generation in rank
    order; then, for the restart, the receipt and the pointer it re-resolved.
    """
    met: list[tuple[str, str, Any]] = []
    for where, commit, _ in _commits(scenario, obs, run_plan):
        met += [
            (f"{where}.pointer_before", "pointer", commit["pointer_before"]),
            (f"{where}.receipt", "receipt", commit["receipt"]),
            (f"{where}.pointer_after", "pointer", commit["pointer_after"]),
        ]
    target = obs.get("target")
    if target is not None:
        met += [
            (f"target.ranks[{i}].generation", "receipt", rank["generation"])
            for i, rank in enumerate(target["ranks"])
        ]
    after = obs.get("after")
    if after is not None:
        met += [("after.receipt", "receipt", after["receipt"])]
        met += [("after.pointer", "pointer", after["pointer"])]
    seen: dict[str, set[str]] = {"pointer": set(), "receipt": set()}
    for where, kind, value in met:
        if value is None or value in seen[kind]:
            continue
        expected = f"{kind}-{len(seen[kind]) + 1}"
        if value != expected:
            return [
                f"{name}.{where}: {value} is a new {kind} here, so it must be {expected}: "
                "labels are numbered in the order the digests first appear"
            ]
        seen[kind].add(value)
    return []
