"""missing_metadata, missing_shard, corrupt_shard: damage after sealing must block promotion.

One group saves twice. The first checkpoint is promoted as the baseline; the second is sealed,
damaged, and offered for promotion, which must refuse it and leave the pointer as it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dcp_invariant.receipt import METADATA_FILE
from dcp_invariant.scenarios.common import STEPS_BEFORE_SAVE, ScenarioContext, training_saves

BASELINE = f"step-{STEPS_BEFORE_SAVE}"
CANDIDATE = f"step-{STEPS_BEFORE_SAVE + 1}"


def _last_shard(directory: Path) -> Path:
    shards = sorted(
        p for p in directory.iterdir() if p.suffix == ".distcp" and p.stat().st_size > 0
    )
    return shards[-1]


def run(ctx: ScenarioContext) -> dict[str, Any]:
    sc = ctx.scenario
    obs = ctx.base_observation()
    obs.update(
        fixture=ctx.fixture,
        steps_before_save=STEPS_BEFORE_SAVE,
        damage={
            "kind": "flip" if sc.damage == "corrupt_shard" else "remove",
            "path": "",
            "offset": None,
        },
        baseline=None,
        candidate=None,
        load_attempted=False,
    )
    source = ctx.group(
        "source",
        "train_and_save",
        sc.source_world_size,
        {
            "fixture": ctx.fixture,
            "saves": training_saves(
                ctx, (BASELINE, STEPS_BEFORE_SAVE), (CANDIDATE, STEPS_BEFORE_SAVE + 1)
            ),
            "reference_step": False,
        },
    )
    obs["source"] = source.record()
    if not source.ok:
        return obs
    obs["baseline"] = ctx.commit(BASELINE)

    def damage(candidate: Path) -> None:
        if sc.damage == "missing_metadata":
            target = candidate / METADATA_FILE
            target.unlink()
        elif sc.damage == "missing_shard":
            target = _last_shard(candidate)
            target.unlink()
        else:
            target = _last_shard(candidate)
            offset = target.stat().st_size // 2
            with open(target, "r+b") as f:
                f.seek(offset)
                byte = f.read(1)[0]
                f.seek(offset)
                f.write(bytes([byte ^ 0xFF]))
            obs["damage"]["offset"] = offset
        obs["damage"]["path"] = target.name

    obs["candidate"] = ctx.commit(CANDIDATE, damage=damage)
    return obs
