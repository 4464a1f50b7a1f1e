"""Diagnoses of a user's fixture run: which keys, which step, and the likely cause, ranked.

Works on per-key records ``{path: "<dtype>[<shape>] <sha256>"}`` alone, so the verifier derives
the same sentences without torch. The causes, in the order they are reported:

1. state that did not round-trip through DCP (loaded != saved);
2. loaded == saved, but a resumed step differs: state that lives outside ``state_dict()``;
3. the fixture does not repeat itself: two uninterrupted runs differ, so nothing is blamed;
4. a step returned a NaN or infinite loss: the loop diverged, and nothing after it compares.

Some findings are cautions (:class:`Caution`), not reasons: the resume is exact as far as any
step shows, yet something could matter later (``restored late``: loaded != saved while every
resumed step matches; a generator that differs at the end which no step drew from). They are
shown as ``warning:`` lines and recorded as the result's warnings; the scenario passes.

The max absolute differences come from the workers (they need the values); the verifier checks
that they name only keys whose digests differ, and treats the numbers as free.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dcp_invariant import plan

Keys = Mapping[str, str]


class Caution(str):
    """A finding that does not fail the scenario: a family's rule returns it among its reasons,
    and :func:`dcp_invariant.evidence.rules.judge` files it under the result's warnings."""

    __slots__ = ()


KEY_ENTRY = re.compile(r"(\S{1,80}) ([0-9a-f]{64})")
MAX_KEYS_NAMED = 8
ROUND_TRIP = "did not round-trip through DCP"
OUTSIDE_STATE_DICT = "state outside state_dict()"
# The same two causes for an app that saves itself: its own save() and load() lost a key, or
# (with no state_dict() to compare) its resumed steps differ.
APP_ROUND_TRIP = "did not round-trip through the app's save() and load()"
NOT_RESTORED = "not restored by the app's save() and load()"
# What an app's own save wrote that the commit protocol cannot seal: a subdirectory, a link,
# nothing (dcp_invariant/commit/receipt.py).
UNSEALABLE = "the app's save() cannot be sealed"
# An entry of an app's own save that appeared, changed or went after its save() returned (a
# thread still writing): sealed, it would hold whatever that thread had written by then
# (dcp_invariant/commit/after_save.py).
WRITTEN_AFTER_SAVE = "written after the app's save() returned"
# An app's own load() that returned, on every rank, on a checkpoint cut short (half_written).
LOADS_CUT_SHORT = "the app's load() takes a checkpoint cut short"
# Loaded != saved right after the load, yet every resumed step matches: the load is applied
# later (at the first step), so a checkpoint taken before that step would not resume.
RESTORED_LATE = "restored late"
NONDETERMINISTIC = "non-deterministic fixture"
# An arm that saved parts from one that never saved (nor read state_dict()), at or after the
# save: the checkpoint changed the training it checkpoints.
SAVE_CHANGED_TRAINING = "the save changed training"
NON_FINITE = "non-finite loss"
# The user's own code raised and so ended a rank (any BaseException: SystemExit and torch's
# CheckpointException too), by where it came from: the fixture function or the app's method.
APP_RAISED: dict[plan.AppMethod, str] = {
    m: "the fixture raised" if m == "fixture" else f"the app's {m}() raised"
    for m in plan.APP_METHODS
}
# A rank that exited, with code 0 or not, without its report: the loop ended the process itself
# (os._exit) or something killed it. One that reported and then failed: its log says why.
NO_REPORT = "a rank exited without reporting"
RANK_FAILED = "a rank failed after reporting"
# ``preempt``'s causes: the job relaunched on what a kill left crashed (or hung), resumed to
# other step lines or another final state, or resumed from before a save that was whole.
CANNOT_RESUME = "cannot resume after a crash"
OTHER_RESULT = "resumed to another result after a crash"
LOST_CHECKPOINT = "lost a completed checkpoint"
# A group killed at its deadline (families._groups.timed_out); check() reports a fixture whose
# first step timed out under it too.
TIMEOUT = "timeout"
# A reshard's own causes: the load failed at the target world size, or it succeeded and left
# saved values that no target rank asked for (torchtitan issue #811).
DOES_NOT_RESHARD = "does not reshard"
NOT_LOADED = "saved state not loaded"
# A cross-release scenario's own causes (``run --resume-with-torch``): the other release's load
# refused the checkpoint, or it loaded and a key's value changed on the way.
DOES_NOT_LOAD_ON_OTHER = "does not load on the other torch release"
CHANGED_ACROSS_RELEASES = "changed between torch releases"
SUSPECTS = (
    "check what steers the next step and is not saved: generators and the global RNG, the "
    "data position and shuffle order, the LR scheduler, step and accumulation counters, "
    "gradients accumulated over several step() calls (make step() one optimizer step)"
)


def kind(entry: str) -> str:
    """``float32[4,2]`` of ``"float32[4,2] <digest>"``."""
    return entry.split(" ", 1)[0]


def number(hex_float: str) -> str:
    """A recorded ``float.hex()`` as decimal and as hex."""
    try:
        return f"{float.fromhex(hex_float)!r} ({hex_float})"
    except ValueError:
        return hex_float


def _magnitude(diffs: Sequence[Mapping[str, Any]], phase: str, key: str) -> str:
    for diff in diffs:
        if diff["phase"] == phase and diff["key"] == key and diff["max_abs_diff"] is not None:
            try:
                return f" (max abs diff {float.fromhex(diff['max_abs_diff'])!r})"
            except ValueError:
                return f" (max abs diff {diff['max_abs_diff']})"
    return ""


def differing_keys(expected: Keys, got: Keys) -> list[str]:
    if expected == got:  # the common case, decided in C
        return []
    return sorted(k for k in set(expected) | set(got) if expected.get(k) != got.get(k))


def named(keys: list[str]) -> str:
    """Up to MAX_KEYS_NAMED keys, and how many more."""
    shown = ", ".join(keys[:MAX_KEYS_NAMED])
    return shown + (f" (+{len(keys) - MAX_KEYS_NAMED} more)" if len(keys) > MAX_KEYS_NAMED else "")


def round_trip_cause(scenario: plan.Scenario) -> str:
    """Cause 1 as a scenario names it: through DCP, or through the app's own save and load."""
    return ROUND_TRIP if scenario.checkpointing == "dcp" else APP_ROUND_TRIP


def outside_cause(scenario: plan.Scenario) -> tuple[str, str]:
    """Cause 2 as a scenario names it, and what to check: state the tool compared yet the
    steps differ, or, for an app that shows none, steps that differ after its own load."""
    if scenario.compares_state:
        return OUTSIDE_STATE_DICT, SUSPECTS
    return NOT_RESTORED, (
        "the app has no state_dict(), so what its save() kept and its load() restored could "
        "not be compared: " + SUSPECTS
    )


def round_trip(
    where: str,
    saved: Keys,
    loaded: Keys,
    saved_elsewhere: Mapping[int, Keys],
    diffs: Sequence[Mapping[str, Any]],
    cause: str = ROUND_TRIP,
) -> list[str]:
    """Cause 1 for one rank: every key whose loaded record differs from the saved one."""
    reasons: list[str] = []
    keys = differing_keys(saved, loaded)
    for key in keys[:MAX_KEYS_NAMED]:
        head = f"{cause}: {where}: {key}"
        if key not in loaded:
            reasons.append(f"{head}: saved {kind(saved[key])}, missing after load")
        elif key not in saved and kind(loaded[key]) == "map[0]":
            reasons.append(f"{head}: empty after load, held saved entries")
        elif key not in saved:
            reasons.append(f"{head}: {kind(loaded[key])} after load, never saved")
        elif kind(saved[key]) != kind(loaded[key]):
            reasons.append(
                f"{head}: saved {kind(saved[key])}, loaded {kind(loaded[key])} "
                f"(dtype or shape changed){_magnitude(diffs, 'loaded', key)}"
            )
        else:
            # DCP keeps one copy of a replicated value; an app's own save is its own affair.
            owner = [
                r
                for r, other in sorted(saved_elsewhere.items())
                if other.get(key) == loaded[key] and cause == ROUND_TRIP
            ]
            tail = (
                f"; it holds rank {owner[0]}'s saved value: DCP keeps one copy of a value that is "
                "not a DTensor, so a per-rank value needs a DTensor or a key per rank"
                if owner
                else ""
            )
            reasons.append(
                f"{head}: loaded {kind(loaded[key])} differs from saved"
                f"{_magnitude(diffs, 'loaded', key)}{tail}"
            )
    if len(keys) > MAX_KEYS_NAMED:
        reasons.append(f"{cause}: {where}: {len(keys) - MAX_KEYS_NAMED} more keys differ")
    return reasons


def resumed_exactly(
    reference: Sequence[Mapping[str, Any]], resumed: Sequence[Mapping[str, Any]], steps: int
) -> bool:
    """Every one of the ``steps`` resumed steps has the uninterrupted run's loss and keys."""
    return len(resumed) == len(reference) == steps and all(
        want["loss"] == got["loss"] and want["keys"] == got["keys"]
        for want, got in zip(reference, resumed, strict=True)
    )


def holds_rank_0s_copy(saved: Keys, loaded: Keys, rank_0s: Keys | None) -> bool:
    """A rank loaded rank 0's saved value (``rank_0s``) of every key it loaded other than it
    saved (so it is not rank 0): the checkpoint kept rank 0's copy of a value that differs by rank
    (Fabric's DDPStrategy and Accelerate save global rank 0's state alone, ``save_checkpoint``
    in lightning/fabric/strategies/strategy.py; DCP keeps one copy of a value that is not a
    DTensor, ``dedup_save_plans`` in torch/distributed/checkpoint/_dedup_save_plans.py).

    With every resumed step matching, that copy was overwritten before anything read it from
    rank 0, as DDP's forward broadcasts rank 0's buffers (``_sync_module_buffers`` from
    ``_check_and_sync_module_buffers`` in torch/nn/parallel/distributed.py), and the state right
    after the load is one the checkpoint holds: a checkpoint taken then resumes alike. Not
    ``restored late``, nothing lost. Rank 0's copy only: a load applied late leaves a fresh
    value, which on some rank may equal what another rank saved (state only rank 0 changes);
    rank 0 itself and a rank holding another's copy are judged as before.
    """
    keys = differing_keys(saved, loaded)
    return bool(keys) and rank_0s_copies(saved, loaded, rank_0s) == set(keys)


def rank_0s_copies(saved: Keys, loaded: Keys, rank_0s: Keys | None) -> set[str]:
    """The keys a rank loaded as rank 0 saved them (``rank_0s``), where it saved another value."""
    if rank_0s is None:
        return set()
    return {
        k
        for k in differing_keys(saved, loaded)
        if k in saved and k in loaded and rank_0s.get(k) == loaded[k]
    }


def restored_late(where: str, what: str, load: str) -> list[str]:
    """Loaded != saved in ``what`` (keys or components, named), yet the resumed steps all match
    (:func:`resumed_exactly`): ``load`` (``load_state_dict()``, or the app's ``load()``) keeps
    what it got and applies it later, as Hugging Face's Trainer restores its RNG states inside
    its loop, just before the first step (``_load_rng_state`` in transformers/trainer.py). The
    resume is exact, and no checkpoint can be taken there in such a loop: a caution."""
    return [
        Caution(
            f"{RESTORED_LATE}: {where}: right after {load}, state_dict() differs from what was "
            f"saved in {what}, yet every resumed step matches: the loaded state is applied later "
            "(at the first step); a checkpoint taken between the load and that step would save "
            f"the fresh state and not resume, so apply it in {load} itself if the loop can save "
            "there"
        )
    ]


# torch.nn.modules.batchnorm._NormBase's buffers, which each rank updates from its own batch.
_BATCH_NORM_STATISTIC = re.compile(r"\.(running_mean|running_var|num_batches_tracked)$")


def round_trip_hints(
    saved: Keys, loaded: Keys, saved_elsewhere: Mapping[int, Keys] | None = None
) -> list[str]:
    """What usually causes the cause-1 keys found, said once per scenario; ``saved_elsewhere``:
    what the other ranks saved, by rank."""
    hints = []
    keys = differing_keys(saved, loaded)
    if any(k not in loaded and ".state." in k for k in keys) or any(
        loaded.get(k, "").startswith("map[0]") and k.endswith(".state") for k in keys
    ):
        hints.append(
            "hint: optimizer state came back empty or incomplete: DCP fills only the keys the "
            "fresh state_dict() already has; save and load the optimizer with "
            "torch.distributed.checkpoint.state_dict.get_state_dict / set_state_dict"
        )
    # Another rank's copy, not rank 0's: under DDP, rank 0 then broadcasts it at the next
    # forward (holds_rank_0s_copy is the case that passes).
    kept = [
        r
        for k in keys
        if _BATCH_NORM_STATISTIC.search(k) and k in saved and k in loaded
        for r, other in sorted((saved_elsewhere or {}).items())
        if r != 0 and other.get(k) == loaded[k]
    ]
    if kept:
        hints.append(
            "hint: BatchNorm's running statistics differ by rank (each rank normalizes its own "
            f"batch) and DCP kept rank {kept[0]}'s copy: under DDP, whose forward broadcasts "
            "rank 0's buffers, broadcast them from rank 0 in state_dict() "
            "(torch.distributed.broadcast(buffer, 0)) so that the copy kept is rank 0's; or use "
            "SyncBatchNorm"
        )
    if any(k in saved and k in loaded and kind(saved[k]) != kind(loaded[k]) for k in keys):
        hints.append(
            "hint: a dtype or shape changed between save and load: state_dict() or "
            "load_state_dict() casts or reshapes a value"
        )
    return hints


def step_divergence(
    where: str,
    reference: Sequence[Mapping[str, Any]],
    resumed: Sequence[Mapping[str, Any]],
    diffs: Sequence[Mapping[str, Any]],
    steps_before: int,
    loaded_equals_saved: bool,
    outside: tuple[str, str] = (OUTSIDE_STATE_DICT, SUSPECTS),
    objects: str = "",
    lost: str = ROUND_TRIP,
) -> list[str]:
    """The first resumed step whose loss or state differs from the uninterrupted run;
    ``outside``: the cause and advice when what was loaded equals what was saved; ``objects``:
    the app's attributes that differ after the load, named before the advice; ``lost``: the
    cause a step that follows from a lost key is filed under (:func:`round_trip_cause`)."""
    for index, (want, got) in enumerate(zip(reference, resumed, strict=False), start=1):
        keys = differing_keys(want["keys"], got["keys"])
        if want["loss"] == got["loss"] and not keys:
            continue
        step = f"step {steps_before + index} (resumed step {index})"
        facts = []
        if want["loss"] != got["loss"]:
            facts.append(f"loss expected {number(want['loss'])}, got {number(got['loss'])}")
        if keys:
            phase = f"step-{index}"
            shown = [f"{k}{_magnitude(diffs, phase, k)}" for k in keys[:MAX_KEYS_NAMED]]
            facts.append("keys that differ first: " + named(shown + keys[MAX_KEYS_NAMED:]))
        if not loaded_equals_saved:
            # Filed under the cause that explains it, as every reason is (check() groups
            # reasons by the text before their first ": ").
            return [
                f"{lost}: {where}: {step} differs, a consequence of the keys above: "
                + "; ".join(facts)
            ]
        cause, advice = outside
        lead = "loaded == saved, but" if cause == OUTSIDE_STATE_DICT else "after the app's load(),"
        found = f"; {objects}" if objects else ""
        reasons = [
            f"{cause}: {where}: {lead} {step} differs: " + "; ".join(facts) + f"{found}; {advice}"
        ]
        if any(re.search(r"\.param_groups\.\d+\.lr$", k) for k in keys):
            reasons.append(
                f"{OUTSIDE_STATE_DICT}: {where}: the learning rate itself differs after {step}: an LR "
                "scheduler whose state is not in state_dict()"
            )
        return reasons
    if len(resumed) != len(reference):
        return [f"{where}: took {len(resumed)} resumed steps, the plan has {len(reference)}"]
    return []


def nondeterminism(where: str, first: Mapping[str, Any], second: Mapping[str, Any]) -> list[str]:
    """Cause 3: where two uninterrupted runs of one rank part, if they do."""

    def steps(arm: Mapping[str, Any]) -> list[tuple[str, Keys]]:
        # Before the save only losses are recorded; at the save, every key too.
        before: list[tuple[str, Keys]] = [(loss, {}) for loss in arm["losses_before"]]
        if before:
            before[-1] = (before[-1][0], arm["saved"] or {})
        return before + [(s["loss"], s["keys"]) for s in arm["steps"]]

    found = parting(steps(first), steps(second))
    if found is None:
        return []
    index, what = found
    return [
        f"{NONDETERMINISTIC}: {where}: two uninterrupted runs differ at step {index} in {what}; the "
        "resume cannot be judged: seed every generator, draw no unseeded random numbers, "
        "keep the thread count fixed"
    ]


def parting(
    first: Sequence[tuple[str, Keys]], second: Sequence[tuple[str, Keys]]
) -> tuple[int, str] | None:
    """The first step (from 1) at which two runs' ``(loss, keys)`` differ, and in what; None
    where every step both took agrees."""
    for index, ((loss_a, keys_a), (loss_b, keys_b)) in enumerate(
        zip(first, second, strict=False), start=1
    ):
        keys = differing_keys(keys_a, keys_b)
        if loss_a == loss_b and not keys:
            continue
        return index, named(keys) if keys else f"the loss ({number(loss_a)} vs {number(loss_b)})"
    return None


def save_changed_training(
    where: str, never: Sequence[str], saving: Sequence[str], steps_before: int, named_objects: str
) -> list[str]:
    """The losses after the save of an arm that never saved (``never``) and of one that saved
    (``saving``), which agreed on every step before it: the first step where they part.
    ``named_objects``: what differed in the app's objects right after the save, if anything."""
    for index, (want, got) in enumerate(zip(never, saving, strict=False), start=1):
        if want == got:
            continue
        return [
            f"{SAVE_CHANGED_TRAINING}: {where}: a run that never saves and one that saved after "
            f"step {steps_before} part at step {steps_before + index} (loss {number(want)} vs "
            f"{number(got)}), though they agree on every step before the save: the save, or the "
            "state_dict() it reads, changes the training it checkpoints"
            + (f"; {named_objects}" if named_objects else "")
        ]
    return []


CHANGED_DURING_SAVE = "changed during the save"
# The causes in the order a report ranks them (docs/diagnoses.md lists them so): a state that
# did not round-trip explains every later difference, so it comes first.
RANKED_CAUSES = (
    DOES_NOT_LOAD_ON_OTHER,
    *APP_RAISED.values(),
    NO_REPORT,
    RANK_FAILED,
    ROUND_TRIP,
    APP_ROUND_TRIP,
    CHANGED_ACROSS_RELEASES,
    UNSEALABLE,
    WRITTEN_AFTER_SAVE,
    LOADS_CUT_SHORT,
    RESTORED_LATE,
    SAVE_CHANGED_TRAINING,
    OUTSIDE_STATE_DICT,
    NOT_RESTORED,
    NONDETERMINISTIC,
    DOES_NOT_RESHARD,
    NOT_LOADED,
    CHANGED_DURING_SAVE,
    NON_FINITE,
    CANNOT_RESUME,
    OTHER_RESULT,
    LOST_CHECKPOINT,
)


def changed_during_save(
    where: str, saved: Keys, after_save: Keys, loaded: Keys, steps_before: int, by_app: bool
) -> list[str]:
    """Keys an async checkpoint holds as they were after the overlapping step, not at the save;
    ``by_app``: the async save was the app's own."""
    keys = sorted(k for k in loaded if saved.get(k) != loaded[k] and after_save.get(k) == loaded[k])
    if not keys:
        return []
    how = (
        "the app's save() returned before it had copied them, and its write read them later: "
        "copy (stage) the state before save() returns, as dcp.async_save does"
        if by_app
        else "a state_dict() that returns live references, or a stager that copies late; the "
        "next step had started before the write"
    )
    return [
        f"{CHANGED_DURING_SAVE}: {where}: {named(keys)} hold the state after step "
        f"{steps_before + 1}, which ran during the write, not the state at the save: the write "
        f"read tensors the training loop went on changing ({how})"
    ]


def non_finite_loss(where: str, step: int, loss: str) -> str:
    """Cause 4: the loop itself diverged at ``step`` (its loss as recorded: nan, inf, -inf)."""
    return (
        f"{NON_FINITE}: {where}: step {step} returned {loss}, so nothing after it can be compared; "
        "find what overflows or divides by zero (the learning rate, the data, a loss scale), "
        "or check fewer steps (--steps-before, --steps-after)"
    )
