"""A fixture run's artifact (schema v5), put together without torch for the torch-free tests.

No real fixture-run artifact is checked in yet; this one has the structure a run of
``examples/mlp_fixture.py`` at world sizes 1 and 2 gives: per-key records that agree wherever
the same fixture was trained the same steps at the same world size, DCP's file layout, and the
registered run's torchrun restart as its elastic scenario. Its digests and sizes are made up,
so it tests the verifier's logic, never what a real run records.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from artifact_data import DATA_ARTIFACT, read_observations

from dcp_invariant import dcp_layout, plan
from dcp_invariant.evidence import artifact, provenance, schema

FIXTURE = "examples.mlp_fixture:fixture"
PLAN = plan.fixture_plan(FIXTURE, (1, 2), 3, 2)
KEYS = {  # a few of the example's keys: enough for every rule, few enough to mutate quickly
    "app.model.0.weight": "float64[4,4]",
    "app.optim.state.0.weight.momentum_buffer": "float64[4,4]",
    "app.optim.param_groups.0.lr": "float",
    "app.rng": "uint8[5056]",
}
SIZES = {1: [3202, 9001], 2: [3611, 5120, 5120]}  # .metadata, then one shard per rank


def _hex(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _loss(*parts: object) -> str:
    mantissa = _hex("loss", *parts)[:13]
    return f"0x1.{mantissa}p-3"


def keys(w: int, step: int) -> dict[str, str]:
    """The state on every rank at world size ``w`` after ``step`` steps (replicated values)."""
    return {k: f"{kind} {_hex(w, step, k)}" for k, kind in KEYS.items()}


def objects(w: int, step: int) -> dict[str, str]:
    """The app's attributes after ``step`` steps: its model's tensors and a step counter."""
    return {
        **{k.replace("app.", "app.state.", 1): v for k, v in keys(w, step).items()},
        "app.steps": f"int {step}",
    }


def files(w: int) -> list[dict[str, Any]]:
    names = [dcp_layout.METADATA_FILE] + [f"__{r}_0.distcp" for r in range(w)]
    return [{"path": n, "size": s} for n, s in zip(names, SIZES[w], strict=True)]


def commit(w: int) -> dict[str, Any]:
    return {
        "candidate_retained": False,
        "files": files(w),
        "generations_after": 1,
        "generations_before": 0,
        "label": PLAN.baseline_label,
        "pointer_after": "pointer-1",
        "pointer_before": None,
        "promoted": True,
        "receipt": "receipt-1",
        "refused": [],
        "seal_error": None,
        "sealed": True,
    }


def train_group(w: int, steps_after: int) -> dict[str, Any]:
    n = PLAN.steps_before
    ranks = [
        {
            "losses_before": [_loss(w, s) for s in range(1, n + 1)],
            "objects": {"final": objects(w, n + steps_after), "saved": objects(w, n)},
            "rank": r,
            "saved": keys(w, n),
            "steps": [
                {"keys": keys(w, n + s), "loss": _loss(w, n + s)} for s in range(1, steps_after + 1)
            ],
        }
        for r in range(w)
    ]
    return {"exit_codes": [0] * w, "ranks": ranks, "timed_out": False}


def never_saves_group(w: int) -> dict[str, Any]:
    """The arm that never saves: the same losses, its walks where the arms that save walk."""
    n, k = PLAN.steps_before, PLAN.steps_after
    ranks = [
        {
            "losses_after": [_loss(w, n + s) for s in range(1, k + 1)],
            "losses_before": [_loss(w, s) for s in range(1, n + 1)],
            "objects": {"final": objects(w, n + k), "saved": objects(w, n)},
            "rank": r,
        }
        for r in range(w)
    ]
    return {"exit_codes": [0] * w, "ranks": ranks, "timed_out": False}


def resume_group(a: int, b: int, compare: bool) -> dict[str, Any]:
    """Ranks at ``b`` that loaded the state saved at ``a`` and took K steps."""
    n, k = PLAN.steps_before, PLAN.steps_after
    ranks = [
        {
            "diffs": [],
            "load_error": None,
            "generation": "receipt-1",
            "loaded": keys(a, n),
            "objects": {"final": objects(b, n + k), "loaded": objects(a, n)},
            "rank": r,
            "refused": [],
            "steps": [
                {"keys": keys(b, n + s) if compare else keys(a * 10 + b, n + s), "loss": loss}
                for s in range(1, k + 1)
                for loss in [_loss(b, n + s) if compare else _loss(a * 10 + b, n + s)]
            ],
            "verified_after_load": True,
            "verified_before_load": True,
        }
        for r in range(b)
    ]
    return {"exit_codes": [0] * b, "ranks": ranks, "timed_out": False}


def _common(name: str) -> dict[str, Any]:
    scenario = PLAN.scenario(name)
    return {
        "errors": [],
        "fixture": FIXTURE,
        "left_running": [],
        "scenario": name,
        "schema_version": schema.FIXTURE_SCHEMA_VERSION,
        "source_world_size": scenario.source_world_size,
        "steps_after": PLAN.steps_after,
        "steps_before_save": PLAN.steps_before,
        "target_world_size": scenario.target_world_size,
    }


def observations() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for scenario in PLAN.scenarios:
        name, a, b = scenario.name, scenario.source_world_size, scenario.target_world_size
        if scenario.family in ("resume", "async_resume"):
            out[name] = {
                **_common(name),
                "commit": commit(a),
                "never_saves": never_saves_group(a),
                "reference": train_group(a, PLAN.steps_after),
                "repeat": train_group(a, PLAN.steps_after),
                "target": resume_group(a, b, compare=True),
            }
            if scenario.family == "async_resume":  # the write overlapped step N+1, as planned
                mode = scenario.async_mode
                out[name]["save_mode"] = mode
                facts = {"pending_during_step": True, "staged_first": mode == "staged"}
                for rank in out[name]["reference"]["ranks"]:
                    rank["async"] = {**facts, "upload_error": None}
        elif scenario.family == "reshard":
            out[name] = {
                **_common(name),
                "commit": commit(a),
                "source": train_group(a, PLAN.steps_after),
                "target": resume_group(a, b, compare=False),
                "left_out": [],
            }
    # A loop that left a child running in its uninterrupted run: a warning, not a failure.
    out["resume_2"]["left_running"] = [{"group": "reference", "programs": ["sleep"]}]
    elastic = copy.deepcopy(read_observations(DATA_ARTIFACT)["elastic_restart_2_to_2"])
    elastic.update(
        fixture=FIXTURE,
        left_running=[],
        schema_version=schema.FIXTURE_SCHEMA_VERSION,
        steps_before_save=PLAN.steps_before,
    )
    elastic["commit"]["files"] = files(2)  # the same save as resume_2's
    out["elastic_restart_2_to_2"] = elastic
    return out


def build() -> dict[str, bytes]:
    record = provenance.build(
        source_revision="0123456789abcdef0123456789abcdef01234567",
        torch_distribution="2.13.0+cpu",
        torch_runtime="2.13.0+cpu",
        numpy="2.4.6",
        run_plan=PLAN,
    )
    # The provenance's CPython is this interpreter's: fine, any 3.11+ is valid.
    return artifact.build(observations(), record, run_plan=PLAN)
