"""missing_metadata, missing_shard, corrupt_shard: damage after sealing must block promotion.

One group saves twice. The first checkpoint is promoted as the baseline; the second is sealed,
damaged as the plan says, and offered for promotion, which must refuse it and leave the pointer
as it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dcp_invariant.suite.scenarios.common import ScenarioContext


def _target(directory: Path, suffix: str) -> Path:
    """The last non-empty file whose name ends with ``suffix`` (``.metadata`` is such a name)."""
    matches = sorted(
        p for p in directory.iterdir() if p.name.endswith(suffix) and p.stat().st_size > 0
    )
    if not matches:
        raise FileNotFoundError(f"{directory.name} holds no non-empty {suffix} file to damage")
    return matches[-1]


def run(ctx: ScenarioContext) -> dict[str, Any]:
    planned = ctx.scenario.damage
    assert planned is not None, ctx.scenario.name
    obs = ctx.begin(
        fixture=ctx.fixture,
        steps_before_save=ctx.run_plan.steps_before,
        damage={"kind": planned.kind, "path": "", "offset": None},
        baseline=None,
        candidate=None,
        load_attempted=False,
    )

    def damage(candidate: Path) -> None:
        target = _target(candidate, planned.target_suffix)
        if planned.kind == "remove":
            target.unlink()
        else:
            offset = target.stat().st_size // 2
            with open(target, "r+b") as f:
                f.seek(offset)
                byte = f.read(1)[0]
                f.seek(offset)
                f.write(bytes([byte ^ 0xFF]))
            obs["damage"]["offset"] = offset
        obs["damage"]["path"] = target.name

    with ctx.recording(obs):
        if ctx.train(obs, ctx.run_plan.baseline_then_candidate, reference_step=False).ok:
            obs["baseline"] = ctx.commit(ctx.run_plan.baseline_label)
            obs["candidate"] = ctx.commit(ctx.run_plan.candidate_label, damage=damage)
    obs["load_attempted"] = ctx.load_attempted()
    return obs
