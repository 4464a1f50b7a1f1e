"""What the app's own objects say about a resume (torch-free): the attributes that differ.

Each rank records fingerprints of the app object's attributes (``dcp_invariant/ranks/
app_objects.py``) at the save and at the end of an uninterrupted arm, and right after the load
and at the end of a resumed one. Compared, they name the cause where ``state_dict()`` cannot:
``app.sampler.epoch`` saved 3, loaded 0. An attribute that differs between the two
uninterrupted arms at the same point (a timestamp, an id) is volatile and never named.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

Objects = Mapping[str, str]
# What a fingerprint the two uninterrupted arms disagree on is recorded as (:func:`settle`).
VOLATILE = "volatile"
# Where the resumed arm's walk is compared with the arms': right after the load with the save.
_MATCHING = (("saved", "loaded"), ("final", "final"))
_ARM, _RESUMED = ("saved", "final"), ("loaded", "final")
_DIGEST = re.compile(r"[0-9a-f]{64}")

MAX_NAMED = 8
# A value whose every bit is compared: a tensor's ("float32[4,4] ~3", DTensor shards included)
# or a generator's state, by its digest, or by the digest's label once the artifact is written
# (:func:`intern`; the runner judges each scenario before). The end of a resume compares these
# only: a number or a string that differs there without a loss showing it is bookkeeping (a
# counter of loads, a path), while a tensor that differs is state a later evaluation or export
# reads.
_COMPARED_AT_END = re.compile(r"(?:\S+\[[\d,]*\]|Generator) (?:~\d+|[0-9a-f]{64})")
# A generator's state (a torch.Generator's): a difference at the end of a resume matters only
# when a later step draws from it, which the arms run further show (resume_evidence.rule).
_GENERATOR = re.compile(r"Generator (?:~\d+|[0-9a-f]{64})")
# The global RNGs: other processes' history (the tool's own, torch's) moves them too, so the
# end of a resume does not judge them; right after the load they are named like the rest.
_GLOBAL = "rng."
_NUMBER = re.compile(r"(?:int|float) \S+|True|False|None")

# A named attribute's likely cause and its fix, by path (the first that matches), for the
# kinds of state that users most often leave out of state_dict().
_CAUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"(^|\.)(_scale|_growth_tracker)$"),
        "a loss scaler (GradScaler) is not saved: save scaler.state_dict() and load it back",
    ),
    (
        re.compile(r"(^|\.)(n_averaged|ema[^.]*|teacher[^.]*|swa[^.]*|averaged[^.]*)(\.|$)"),
        "an EMA or averaged model is not saved: save its state_dict() beside the model's",
    ),
    (
        re.compile(r"(^|\.)epoch$"),
        "a sampler's or loader's epoch is not restored: save it, and call "
        "sampler.set_epoch(epoch) after the load",
    ),
    (
        re.compile(r"^rng\."),
        "a global RNG is not saved: save torch.get_rng_state() (and random.getstate(), "
        "numpy.random.get_state() where the loop draws from them) and set it back",
    ),
    (
        re.compile(r"(^|\.)(gen|[^.]*generator[^.]*|[^.]*rng[^.]*)$"),
        "a torch.Generator is not saved: save its get_state() and set_state() it at the load",
    ),
    (
        re.compile(r"\.optim[^.]*\.state\.\d+\."),
        "the optimizer's state is partial after the load: load it with "
        "torch.distributed.checkpoint.state_dict.set_state_dict, which fills every parameter's",
    ),
)


def volatile(first: Objects | None, second: Objects | None) -> set[str]:
    """Attributes that differ between two uninterrupted runs at one point: never named."""
    if first is None or second is None:
        return set()
    return {p for p in first.keys() | second.keys() if first.get(p) != second.get(p)}


def differing(expected: Objects, got: Objects) -> list[str]:
    """Paths whose fingerprints differ, in path order. What two uninterrupted runs disagree on
    reads :data:`VOLATILE` in every walk (:func:`settle`), so it never differs here."""
    return sorted(p for p in expected.keys() | got.keys() if expected.get(p) != got.get(p))


def at_the_end(expected: Objects, got: Objects) -> list[str]:
    """The tensors and generators of the app that differ after the same steps
    (:data:`_COMPARED_AT_END`)."""
    # Only a path both walks reached: a walk records an object at the first path that reaches
    # it, so an alias that one run keeps (a load() that holds {"model": self.model}) moves
    # where the other records it, and its absence proves nothing.
    return [
        p
        for p in differing(expected, got)
        if p in expected
        and p in got
        and not p.startswith(_GLOBAL)
        and any(_COMPARED_AT_END.fullmatch(v) for v in (expected[p], got[p]))
    ]


def generators_alone(expected: Objects, got: Objects, paths: Sequence[str]) -> bool:
    """Whether every one of ``paths`` (:func:`at_the_end`) is a generator in both walks."""
    return bool(paths) and all(
        _GENERATOR.fullmatch(expected[p]) and _GENERATOR.fullmatch(got[p]) for p in paths
    )


def changed_by_save(never: Objects, saving: Objects) -> list[str]:
    """The tensors and generators (:data:`_COMPARED_AT_END`) that differ right after the save
    between an arm that never saved and one that saved, or that only one of them has: what the
    save, or the ``state_dict()`` it read, did to the app (both walks were marked volatile
    alike, :func:`settle`). The global RNGs are left out, as at the end of a resume."""
    return [
        p
        for p in differing(never, saving)
        if not p.startswith(_GLOBAL)
        and VOLATILE not in (never.get(p), saving.get(p))
        and any(_COMPARED_AT_END.fullmatch(v) for v in (never.get(p, ""), saving.get(p, "")))
    ]


# What a save that changed training most often did, by what it left in the app.
_SAVE_CAUSES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"\.state\.\d+\."),
        "an optimizer that had not stepped yet (no state) was stepped with zero gradients by "
        "get_state_dict / get_optimizer_state_dict as the save read it (_init_optim_state in "
        "torch/distributed/checkpoint/state_dict.py; pytorch#140898), so its step count and "
        "moments now differ from a run that never saved: save an optimizer that has not "
        "stepped with its own state_dict(), or keep it out of the checkpoint until it steps",
    ),
)


def save_causes(paths: Sequence[str]) -> list[str]:
    """The likely reasons a save changed training, from what it changed (:func:`changed_by_save`)."""
    return _fixes(_SAVE_CAUSES, paths)


def shown(expected: Objects, got: Objects, paths: Sequence[str], before: str, after: str) -> str:
    """Up to :data:`MAX_NAMED` paths with what each held: numbers by value, the rest by kind."""
    parts = []
    for path in paths[:MAX_NAMED]:
        was, now = expected.get(path), got.get(path)
        if was is None:
            parts.append(f"{path} (new {after}: {_value(now)})")
        elif now is None:
            parts.append(f"{path} ({before} {_value(was)}, missing {after})")
        elif _NUMBER.fullmatch(was) and _NUMBER.fullmatch(now):
            parts.append(f"{path} ({before} {was}, {after} {now})")
        else:
            parts.append(f"{path} ({_kind(was)}, differs)")
    if len(paths) > MAX_NAMED:
        parts.append(f"{len(paths) - MAX_NAMED} more")
    return ", ".join(parts)


def likely_causes(paths: Sequence[str]) -> list[str]:
    """The fixes for the kinds of state named, once each, in the order of :data:`_CAUSES`."""
    return _fixes(_CAUSES, paths)


def _fixes(table: Sequence[tuple[re.Pattern[str], str]], paths: Sequence[str]) -> list[str]:
    """Each fix of ``table`` whose pattern some path matches, in the table's order."""
    return [fix for pattern, fix in table if any(pattern.search(p) for p in paths)]


def _value(entry: str | None) -> str:
    if entry is None:
        return "nothing"
    return entry if _NUMBER.fullmatch(entry) else _kind(entry)


def _kind(entry: str) -> str:
    """``float32[4,4]`` of ``"float32[4,4] <digest>"``; the entry itself when it has no digest."""
    head, _, tail = entry.rpartition(" ")
    return head if _DIGEST.fullmatch(tail) or re.fullmatch(r"~\d+", tail) else entry


def ignored(path: str, paths: Sequence[str]) -> bool:
    """``path`` is one of ``paths`` (``--ignore-attr``) or below one."""
    return any(path == p or path.startswith(p + ".") for p in paths)


def settle(
    first: Any, second: Any, resumed: Any, ignoring: Sequence[str] = (), *, never_saves: Any = None
) -> None:
    """Mark what the ranks recorded of the app's objects that a run cannot repeat, in place,
    and leave out the attributes the plan ignores (``ignoring``); :func:`intern` then labels
    the digests, run-wide.

    ``first`` and ``second`` are the two uninterrupted arms that save (group records),
    ``resumed`` the resumed group's, ``never_saves`` the arm that never saves (each may be
    None). An attribute the two saving arms disagree on at a point (a timestamp; Python's own
    RNG, reseeded in every process) becomes :data:`VOLATILE` there, in every arm and in the
    resumed arm at the matching point; one only the resumed arm has is kept by its kind alone
    (a value the arms never had, such as a time the load took, may differ in every run).
    Evidence holds no value that a run cannot repeat.
    """
    arms = [_by_rank(first), _by_rank(second)]
    never = _by_rank(never_saves)
    target = _by_rank(resumed)
    walked = ((arms[0], _ARM), (arms[1], _ARM), (never, _ARM), (target, _RESUMED))
    if ignoring:
        for group, phases in walked:
            for rank in group.values():
                for phase in phases:
                    recorded = walk(rank, phase)
                    if recorded is not None:
                        for path in [p for p in recorded if ignored(p, ignoring)]:
                            del recorded[path]
    for rank in sorted(arms[0].keys() | arms[1].keys()):
        for arm_phase, resumed_phase in _MATCHING:
            walks = [walk(arm.get(rank), arm_phase) for arm in arms]
            unstable = volatile(*walks) if all(w is not None for w in walks) else set()
            for recorded in walks:
                _mark(recorded, unstable)
            _mark(walk(never.get(rank), arm_phase), unstable)
            _settle_resumed(walk(target.get(rank), resumed_phase), walks[0], unstable)


# Where an observation keeps walks, in the order their digests are labelled (:func:`intern`)
# and searched for an ignored attribute (rules.py).
WALKING_ARMS = ("reference", "never_saves", "repeat", "target", "source")
_PHASES = ("saved", "loaded", "final")


def intern(observations: Sequence[Any]) -> None:
    """Label every digest of every walk that ``observations`` hold, in place, numbered by
    first appearance across all of them (:func:`_intern`): one run's labels, so equal labels in
    two files of an artifact are equal values, and the files repeat from run to run.

    ``observations`` in the plan's order, as the artifact stores them (:mod:`.shared_arms`).
    """
    walks = []
    for obs in observations:
        for arm in WALKING_ARMS:
            group = obs.get(arm) if isinstance(obs, dict) else None
            by_rank = _by_rank(group) if isinstance(group, dict) else {}
            for rank in sorted(by_rank):
                walks += [walk(by_rank[rank], phase) for phase in _PHASES]
    _intern(walks)


def _by_rank(group: Any) -> dict[int, Any]:
    if group is None:
        return {}
    return {r["rank"]: r for r in group["ranks"] if isinstance(r, dict) and "rank" in r}


def walk(rank: Any, phase: str) -> MutableMapping[str, str] | None:
    """A rank record's walk at ``phase``; None where the rank, or the walk, is missing."""
    if rank is None or rank.get("objects") is None:
        return None
    found: MutableMapping[str, str] | None = rank["objects"].get(phase)
    return found


def _mark(walk: MutableMapping[str, str] | None, paths: set[str]) -> None:
    if walk is not None:
        for path in paths & walk.keys():
            walk[path] = VOLATILE


def _settle_resumed(
    walk: MutableMapping[str, str] | None, arm: Objects | None, unstable: set[str]
) -> None:
    if walk is None:
        return
    _mark(walk, unstable)
    if arm is not None:
        for path in walk.keys() - arm.keys():
            walk[path] = kind_only(walk[path])


def _intern(walks: Sequence[MutableMapping[str, str] | None]) -> None:
    """Each digest as a label numbered by first appearance in ``walks`` (``~1``, ``~2``...):
    equal labels are equal values. A digest of a value no step sets (NumPy's global RNG,
    seeded once per run in the process workers fork from) differs from run to run while
    every arm of one run agrees on it; the labels say the same in every run."""
    labels: dict[str, str] = {}
    for walk in walks:
        if walk is None:
            continue
        for path in sorted(walk):
            head, _, tail = walk[path].rpartition(" ")
            if _DIGEST.fullmatch(tail):
                walk[path] = f"{head} {labels.setdefault(tail, f'~{len(labels) + 1}')}"


def kind_only(entry: str) -> str:
    """A fingerprint without its value: ``int``, ``float32[4,4]``, ``Generator``."""
    if entry in ("True", "False"):
        return "bool"
    if _NUMBER.fullmatch(entry):
        return entry.split(" ", 1)[0]
    return _kind(entry)
