"""A generator that differs after a resume's K steps while every step matched: judged by the
arms run further.

A data loader draws a worker base seed from its ``generator`` each time it makes an iterator
(``_BaseDataLoaderIter.__init__`` in torch/utils/data/dataloader.py). A resume makes iterators at
other moments than the uninterrupted run, so that generator ends in another state, and at
``num_workers=0`` with a map-style dataset nothing ever reads the seed: a correct loop. A
sampler's generator that the checkpoint leaves out differs too, and shows only at the next
epoch's shuffle: a bug. After K steps the two look alike. So where a resume's only difference
at the end is generators, the driver runs both arms on to :func:`dcp_invariant.plan.further_steps`
resumed steps (``obs["further"]``, dcp_invariant/suite/scenarios/resume.py), and the difference
fails only if a later step shows it in a loss or a state key; else the scenario passes with a
warning that names it. Tensors that differ at the end (an EMA the checkpoint leaves out) fail at
once, as before: a later evaluation reads them whether or not a step does.
"""

from __future__ import annotations

from typing import Any

from dcp_invariant import plan
from dcp_invariant.evidence import diagnosis, object_causes
from dcp_invariant.evidence.checks import integer, optional, record
from dcp_invariant.evidence.families._fixture_arms import fixture_resume_rank, fixture_train_rank
from dcp_invariant.evidence.families._groups import group_finished
from dcp_invariant.evidence.families._record_parts import Obs, group

# obs["further"]: both arms again, run on to ``steps_after`` resumed steps, without walks.
FURTHER = record(
    steps_after=integer(1),
    reference=optional(group(fixture_train_rank)),
    target=optional(group(fixture_resume_rank)),
)


def drawn_later(obs: Obs) -> bool:
    """Whether a resumed rank matched every step yet differs at the end in generators alone:
    what the driver runs the arms further for (its walks settled, object_causes.settle)."""
    if obs["reference"] is None or obs["target"] is None:
        return False
    reference = {r["rank"]: r for r in obs["reference"]["ranks"]}
    k = obs["steps_after"]
    for rank in obs["target"]["ranks"]:
        arm = reference.get(rank["rank"])
        if arm is None or not diagnosis.resumed_exactly(arm["steps"], rank["steps"], k):
            continue
        final, resumed = object_causes.walk(arm, "final"), object_causes.walk(rank, "final")
        if final is not None and resumed is not None:
            paths = object_causes.at_the_end(final, resumed)
            if object_causes.generators_alone(final, resumed, paths):
                return True
    return False


def judged(
    scenario: plan.Scenario, obs: Obs, rank: int, where: str, named: str, fix: str, ignore: str
) -> list[str]:
    """The reason, or the caution, for rank ``rank``'s generators ``named`` (with what they
    held) that differ after the K resumed steps; ``fix``: how to save them; ``ignore``: how to
    leave them out, which a caution offers."""
    cause, _ = diagnosis.outside_cause(scenario)
    k, further = obs["steps_after"], obs.get("further")
    head = (
        f"{cause}: {where}: every resumed step matches, yet after the {k} resumed steps the "
        f"app's {named} differ from the uninterrupted run's"
    )
    if further is None:
        # A torchrun job's ranks cannot run the arms again after their one restart.
        return [
            diagnosis.Caution(
                f"{head}; no step drew from them, and this host cannot run the arms further to "
                f"see whether a later one does (run --fixture can): {fix}; {ignore}"
            )
        ]
    problems = _incomplete(scenario, further, rank)
    if problems:
        return [f"{head}; the arms run on to {further['steps_after']} steps: {p}" for p in problems]
    reference = _rank(further["reference"], rank)
    resumed = _rank(further["target"], rank)
    parted = diagnosis.parting(_steps(reference), _steps(resumed))
    steps = further["steps_after"]
    if parted is not None:
        index, what = parted
        at = obs["steps_before_save"] + index
        return [
            f"{head}, and run on to {steps} resumed steps, step {at} (resumed step {index}) "
            f"differs in {what}: a later step draws from them; {fix}"
        ]
    return [
        diagnosis.Caution(
            f"{head}, yet all {steps} resumed steps of a longer run match: no step drew from "
            "them. Nothing differs in training unless a step after those does (a new epoch's "
            f"shuffle, a worker's seed): {fix}; {ignore}"
        )
    ]


def _incomplete(scenario: plan.Scenario, further: Obs, rank: int) -> list[str]:
    """Why the arms run further cannot be compared at ``rank``, if they cannot."""
    steps = further["steps_after"]
    for arm, world_size in (
        ("reference", scenario.source_world_size),
        ("target", scenario.target_world_size),
    ):
        if further[arm] is None:
            return [f"{arm}: did not run"]
        problems = group_finished(further[arm], world_size, arm)
        if problems:
            return problems
        found = _rank(further[arm], rank)
        if found is None or len(found["steps"]) != steps:
            return [f"{arm}: rank {rank} did not take the {steps} steps"]
    return []


def _rank(group_record: Obs, rank: int) -> Any:
    return next((r for r in group_record["ranks"] if r["rank"] == rank), None)


def _steps(rank: Obs) -> list[tuple[str, dict[str, str]]]:
    return [(s["loss"], s["keys"]) for s in rank["steps"]]
