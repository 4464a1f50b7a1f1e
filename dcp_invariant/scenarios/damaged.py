"""missing_metadata, missing_shard, corrupt_shard: damage after sealing must block promotion.

One group saves twice. The first checkpoint is promoted as the baseline; the second is sealed,
damaged, and offered for promotion, which must refuse it and leave the pointer as it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dcp_invariant.receipt import METADATA_FILE
from dcp_invariant.scenarios.common import (
    BASELINE,
    CANDIDATE,
    STEPS_BEFORE_SAVE,
    ScenarioContext,
)


def _last_shard(directory: Path) -> Path:
    shards = sorted(
        p for p in directory.iterdir() if p.suffix == ".distcp" and p.stat().st_size > 0
    )
    if not shards:
        raise FileNotFoundError(f"{directory.name} holds no non-empty .distcp shard to damage")
    return shards[-1]


def run(ctx: ScenarioContext) -> dict[str, Any]:
    sc = ctx.scenario
    obs = ctx.begin(
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

    with ctx.recording(obs):
        saves = [(BASELINE, STEPS_BEFORE_SAVE), (CANDIDATE, STEPS_BEFORE_SAVE + 1)]
        if ctx.train(obs, saves, reference_step=False).ok:
            obs["baseline"] = ctx.commit(BASELINE)
            obs["candidate"] = ctx.commit(CANDIDATE, damage=damage)
    obs["load_attempted"] = ctx.load_attempted()
    return obs
