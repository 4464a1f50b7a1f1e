"""provenance.json: which code and which runtime produced an artifact. Unsigned, and says so."""

from __future__ import annotations

import platform
import re
from typing import Any

from dcp_invariant import __version__, errors, plan, runtimes
from dcp_invariant.evidence import checks, schema

_HEX40 = re.compile(r"[0-9a-f]{40}")
valid_revision = _HEX40.fullmatch
# What provenance records where nobody said which revision is under test and there is no git
# checkout to ask (an sdist, a container image without .git): the revision is a free field
# (free_fields.py), so a run there is as valid as anywhere.
UNKNOWN_REVISION = "unknown"
_RECORDED_REVISION = re.compile(rf"[0-9a-f]{{40}}|{UNKNOWN_REVISION}")

# platform.python_version(): "3.11.7", "3.13.0rc2", "3.14.0a1+" for a development build; the
# package requires CPython 3.11 or newer.
_CPYTHON = re.compile(r"3\.(?:1[1-9]|[2-9][0-9])\.[0-9]{1,3}(?:(?:a|b|rc)[0-9]{1,3})?\+?")
# numpy.__version__, a PEP 440 version (https://peps.python.org/pep-0440/), as numpy releases
# and nightly builds spell it: "2.4.6", "2.5.0rc1", "2.5.0.dev0+git20250101.abcdef0".
_NUMPY = re.compile(
    r"[0-9]{1,4}(?:\.[0-9]{1,4}){1,3}(?:(?:a|b|rc)[0-9]{1,4})?(?:\.post[0-9]{1,4})?"
    r"(?:\.dev[0-9]{1,8})?(?:\+[0-9A-Za-z.]{1,64})?"
)
# The releases whose artifacts this verifier reads: its own. 0.5.0 is this tree's first release
# (the repository's v0.1.0 to v0.4.0 tags are an earlier history's, whose artifacts it refuses).
KNOWN_TOOLS: tuple[str, ...] = (f"dcp-invariant {__version__}",)

# platform.system() of the runners the action supports, and the sys.platform their wheels are
# registered under in runtimes.py.
OS_PLATFORMS = {"Linux": "linux", "Darwin": "darwin", "Windows": "win32"}
_MACHINE = re.compile(r"[A-Za-z0-9_.-]{1,32}")  # platform.machine(): x86_64, AMD64, arm64, ...

_FIELDS: dict[str, checks.Check] = {
    "authenticated": checks.one_of(False),
    "machine": checks.pattern(_MACHINE, "a machine architecture like 'x86_64'"),
    "os": checks.one_of(*OS_PLATFORMS),
    "cpython": checks.pattern(_CPYTHON, "a CPython version, 3.11 or newer, like '3.11.7'"),
    "numpy": checks.optional(checks.pattern(_NUMPY, "a numpy version like '2.4.6'")),
    "source_revision": checks.pattern(
        _RECORDED_REVISION, f"a 40-hex source revision or {UNKNOWN_REVISION!r}"
    ),
    "tool": checks.one_of(*KNOWN_TOOLS),
    "torch_distribution": checks.string,
    "torch_runtime": checks.string,
}
SHAPE = checks.record(**_FIELDS, schema_version=checks.one_of(schema.SCHEMA_VERSION))
# A fixture run also records its plan; plan.plan_from_record holds it to the grammar once
# these types hold (it compares and sorts what it is given).
_PLAN_FIELDS: dict[str, checks.Check] = {
    "fixture": checks.string,
    "fixture_args": checks.json_object,
    "kind": checks.string,
    "rank_local": checks.list_of(checks.string, 64),
    "scenarios": checks.list_of(checks.string, 256),
    "steps_after": checks.integer(),
    "steps_before": checks.integer(),
    "world_sizes": checks.list_of(checks.integer(), 16),
}
# Recorded only for an app that saves itself (plan.Plan.to_record), so that a DCP run's
# provenance reads as before.
_OWN_CHECKPOINTING = {key: checks.one_of(value) for key, value in plan.OWN_CHECKPOINTING.items()}
# Recorded only when given: --ignore-attr's paths, and (a run on this machine's pool only)
# --resume-with-torch's releases with the installed one whose save they resume.
_OMISSIBLE_IN_JOB = {**_OWN_CHECKPOINTING, "ignored_attrs": checks.list_of(checks.string, 256)}
_OMISSIBLE = {
    **_OMISSIBLE_IN_JOB,
    "resume_with_torch": checks.list_of(checks.string, 16),
    "torch_release": checks.string,
}
_PLAN = checks.record_omitting(_OMISSIBLE, **_PLAN_FIELDS)
FIXTURE_SHAPE = checks.record(
    **_FIELDS,
    plan=_PLAN,
    schema_version=checks.one_of(schema.FIXTURE_SCHEMA_VERSION),
)
# A run inside the user's torchrun job also records how it was launched.
IN_JOB_SHAPE = checks.record(
    **_FIELDS,
    plan=checks.record_omitting(
        _OMISSIBLE_IN_JOB,
        **_PLAN_FIELDS,
        launch=checks.record(
            backend=checks.one_of(*plan.BACKENDS),
            nodes=checks.integer(1),
            nproc_per_node=checks.integer(1),
            resumed_from=checks.optional(checks.integer(1)),
        ),
    ),
    schema_version=checks.one_of(schema.IN_JOB_SCHEMA_VERSION),
)
SHAPES = {
    schema.SCHEMA_VERSION: SHAPE,
    schema.FIXTURE_SCHEMA_VERSION: FIXTURE_SHAPE,
    schema.IN_JOB_SCHEMA_VERSION: IN_JOB_SHAPE,
}


def shape_problems(record: dict[str, Any]) -> list[str]:
    shape = SHAPES.get(record.get("schema_version"), SHAPE)  # type: ignore[arg-type]
    problems = shape(record, schema.PROVENANCE_FILE)
    if problems:
        return problems
    # The runner refuses any other torch (runtimes.require), so no real run records one; and
    # each OS's CPU wheel reports its own pair (macOS's carry no +cpu).
    pair = (record["torch_distribution"], record["torch_runtime"])
    where = OS_PLATFORMS[record["os"]]
    if runtimes.find(*pair, where) is None:
        problems.append(
            f"{schema.PROVENANCE_FILE}: torch {pair[0]}/{pair[1]} is not a registered runtime "
            f"on {record['os']} (distribution/torch.__version__); this verifier knows "
            f"{runtimes.registered_pairs(where)} there"
        )
    return problems


def listens_on_loopback(record: dict[str, Any]) -> bool:
    """Where the torchrun guard binds the rendezvous store to 127.0.0.1: Linux only."""
    return bool(record["os"] == "Linux")


def recorded_plan(record: dict[str, Any]) -> plan.Plan:
    """The plan an artifact's provenance names; PlanError when it is outside the grammar."""
    if record.get("schema_version") == schema.SCHEMA_VERSION:
        return plan.REGISTERED
    if "plan" not in record:
        raise errors.PlanError("a fixture run's provenance must record its plan")
    return plan.plan_from_record(record["plan"])


def build(
    *,
    source_revision: str,
    torch_distribution: str,
    torch_runtime: str,
    numpy: str | None,
    run_plan: plan.Plan,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        # Nothing signs the artifact: the manifest detects damage, not forgery.
        "authenticated": False,
        "cpython": platform.python_version(),
        "machine": platform.machine(),
        "os": platform.system(),
        "numpy": numpy,
        "schema_version": schema.version_for(run_plan),
        "source_revision": source_revision,
        "tool": f"dcp-invariant {__version__}",
        "torch_distribution": torch_distribution,
        "torch_runtime": torch_runtime,
    }
    if run_plan.kind != "registered":
        record["plan"] = run_plan.to_record()
    return record
