"""half_written_<w>: what an app that saves itself does when its own load() meets a checkpoint
its save() never finished.

Its save has no marker the commit protocol could wait for, as DCP's ``.metadata`` is: it is
sealed once every rank's ``save()`` has returned, so a save cut short (a rank killed inside it)
is never promoted, and the pointer never leads to one. Left to know is the app's own loader
pointed at such a directory by hand, as a job that resumes from the newest directory it finds
would. The source takes N steps and saves; the save is committed, and the driver cuts a copy of
the generation short (:func:`cut_short`); fresh ranks call ``load()`` on the copy. A rank that
refuses stops the resume, loudly; ``load()`` returning on every rank means the job would train
on whatever it read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dcp_invariant.commit import Generation
from dcp_invariant.evidence.families.records import CutRecord
from dcp_invariant.suite.scenarios import save_copy
from dcp_invariant.suite.scenarios.common import ScenarioContext
from dcp_invariant.suite.scenarios.payloads import FIXTURE_LOAD_CUT, FixtureLoadCut
from dcp_invariant.suite.scenarios.reshard import source_committed

CUT = "cut-short"  # the copy, in the scenario's workspace


def cut_short(generation: Generation, target: Path) -> CutRecord:
    """A copy of ``generation`` as a save killed midway leaves it, the same every run: every
    directory it holds made (a save makes a directory before it writes into it), and of its
    files in name order (their paths relative to its root, as its receipt lists them), the
    first half whole, the next one cut to half its bytes, the rest never written. (A real crash
    leaves some such mix; the order names make it repeatable.)"""
    files = generation.receipt.files
    names = [f.path for f in files]
    half = len(names) // 2
    target.mkdir()
    # Sorted, so each directory's parent is made first.
    for sub in generation.receipt.directories:
        (target / sub).mkdir()
    # Holes kept, a chunk at a time, and stopped by an interrupt (:mod:`.save_copy`): an app's
    # file may be gigabytes long, and sparse.
    for name in names[:half]:
        save_copy.copy_file(generation.path / name, target / name)
    cut = files[half]
    save_copy.copy_file(generation.path / cut.path, target / cut.path, cut.size // 2)
    return {"kept": names[:half], "truncated": cut.path, "left_out": names[half + 1 :]}


def run(ctx: ScenarioContext) -> dict[str, Any]:
    sc, the_plan = ctx.scenario, ctx.run_plan
    obs = ctx.begin(
        fixture=ctx.fixture,
        steps_before_save=the_plan.steps_before,
        steps_after=the_plan.steps_after,
        commit=None,
        cut=None,
        cut_load=None,
    )
    with ctx.recording(obs):
        if not source_committed(ctx, obs):
            return obs
        generation = ctx.store.resolve()
        obs["cut"] = cut_short(generation, ctx.workdir / CUT)
        payload: FixtureLoadCut = {
            "shape": the_plan.shape,
            "directory": ctx.written(CUT),
            "fixture": ctx.fixture,
            "fixture_args": the_plan.arguments,
        }
        # Not the "target" other families have: these ranks load no generation.
        loads = ctx.group("cut-load", FIXTURE_LOAD_CUT(payload), sc.target_world_size)
        obs["cut_load"] = loads.record()
    return obs
