"""The cross_release family of a fixture run: saved by the installed torch, loaded by fresh
ranks running another release (``run --resume-with-torch``), every key bit-identical, and the
resumed steps as that release's own continuation from the same checkpoint takes them."""

from __future__ import annotations

from dcp_invariant import plan, runtimes
from dcp_invariant.evidence import diagnosis
from dcp_invariant.evidence.checks import optional, record, string
from dcp_invariant.evidence.families._fixture_arms import (
    fixture_common_fields,
    fixture_resume_rank,
    fixture_sightings,
    fixture_train_rank,
    saved_by_rank,
    source_committed,
)
from dcp_invariant.evidence.families._groups import (
    ended_early,
    first_non_finite_loss,
    group_finished,
)
from dcp_invariant.evidence.families._promotion import (
    commit_at_baseline,
    loaded_through_pointer,
)
from dcp_invariant.evidence.families._record_parts import Obs, always, group

SHAPE = record(
    **fixture_common_fields,
    source=group(fixture_train_rank),
    continued=optional(group(fixture_resume_rank)),
    # torch.__version__ of the ranks that saved and of those that loaded.
    torch=record(saved=string, loaded=string),
)

shape_for = always(SHAPE)

# The first release whose DCP .metadata pickles a sixth TensorProperties field (strides,
# pytorch/pytorch#175011), which the releases before it cannot unpickle: their
# TensorProperties.__setstate__ unpacks five (torch/distributed/checkpoint/metadata.py).
STRIDES_RELEASE = "2.15.0"
# Python 3.14 adds what it got: "(expected 5, got 6)".
_FIVE_FIELDS = "too many values to unpack (expected 5"


def rule(scenario: plan.Scenario, obs: Obs) -> list[str]:
    n, w = obs["steps_before_save"], scenario.source_world_size
    b = scenario.loading_release
    if b is None:
        return ["the scenario names no release to load with: the record is not this plan's"]
    saved_by, loaded_by = obs["torch"]["saved"], obs["torch"]["loaded"]
    try:
        named = plan.cross_release_name(_release(saved_by), _release(loaded_by), w)
    except ValueError:  # not a release's version at all
        named = ""
    if named != scenario.name:
        return [
            f"torch: saved by {saved_by} and loaded by {loaded_by}, not the releases "
            f"{scenario.name} names"
        ]
    reasons, judged = source_committed(scenario, obs)
    if not judged:
        return reasons
    commit, continued, target = obs["commit"], obs["continued"], obs["target"]
    if continued is None:
        return [*reasons, f"continued (torch {b}): did not run"]
    if target is None:
        return [*reasons, f"target (torch {b}): did not run"]
    failed = _load_failures(scenario, target, saved_by, loaded_by)
    if failed:
        return reasons + failed
    reasons += group_finished(continued, w, f"continued group (torch {loaded_by})")
    reasons += group_finished(target, w, f"resumed group (torch {loaded_by})")
    saved = saved_by_rank(obs["source"])
    across = f"saved by torch {saved_by}, loaded by {loaded_by}"
    changed: list[str] = []
    for rank in target["ranks"]:
        where = f"rank {rank['rank']}"
        reasons += loaded_through_pointer(rank, commit, f"resumed {where}")
        if rank["loaded"] is None:
            reasons.append(f"resumed {where} (torch {loaded_by}): did not load")
            continue
        mine = saved.get(rank["rank"], {})
        others = {r: s for r, s in saved.items() if r != rank["rank"]}
        # Rank 0's copy of a value that differs by rank (DDP's BatchNorm statistics) is what
        # the checkpoint holds, and what torch A's own resume of this save loads too: whether
        # it resumes is resume_<w>'s to judge (holds_rank_0s_copy), not a release's change.
        kept = diagnosis.rank_0s_copies(mine, rank["loaded"], saved.get(0))
        changed += diagnosis.round_trip(
            f"{where} ({across})",
            {k: v for k, v in mine.items() if k not in kept},
            {k: v for k, v in rank["loaded"].items() if k not in kept},
            others,
            rank["diffs"],
            diagnosis.CHANGED_ACROSS_RELEASES,
        )
        found = first_non_finite_loss(rank, n)
        if found is not None:
            reasons.append(diagnosis.non_finite_loss(f"resumed {where}", *found))
    if changed:
        return reasons + changed  # every later difference follows from a changed value
    if ended_early(continued) or ended_early(target):
        return reasons  # the steps stopped where the group's reason says
    own = {r["rank"]: r for r in continued["ranks"]}
    for rank in target["ranks"]:
        other = own.get(rank["rank"])
        if other is not None and rank["loaded"] is not None:
            reasons += _parted(f"rank {rank['rank']}", other["steps"], rank["steps"], loaded_by)
    return reasons


def _load_failures(
    scenario: plan.Scenario, target: Obs, saved_by: str, loaded_by: str
) -> list[str]:
    """The other release's load refused the checkpoint: DCP's own words, and what changed
    where that is known. One reason for the group: DCP fails the load on every rank."""
    errors = [r["load_error"] for r in target["ranks"] if r["load_error"] is not None]
    own = [e for e in errors if e["kind"] != "another rank"]
    if not errors:
        return []
    way = "downgrade" if scenario.name.startswith("downgrade") else "upgrade"
    head = (
        f"{diagnosis.DOES_NOT_LOAD_ON_OTHER}: torch {loaded_by} cannot load the checkpoint "
        f"torch {saved_by} saved ({way})"
    )
    if not own:
        return [f"{head}: every rank's load failed, each blaming another"]
    said = sorted({_said(e) for e in own})
    reason = f"{head}: {'; '.join(said)}"
    b, a = scenario.loading_release or "", _release(saved_by)
    if (
        any(_FIVE_FIELDS in (e["exception"] or "") for e in own)
        and _older(b, STRIDES_RELEASE)
        and not _older(a, STRIDES_RELEASE)
    ):
        reason += (
            f"; torch {STRIDES_RELEASE} added a sixth field (strides) to each tensor's entry in "
            f"DCP's .metadata (pytorch/pytorch#175011), which releases before {STRIDES_RELEASE} "
            f"cannot read: a checkpoint written on {STRIDES_RELEASE} or later is lost to a "
            f"rollback; keep the last checkpoint written before the upgrade, or stay on "
            f"{STRIDES_RELEASE} or later"
        )
    return [reason]


def _said(error: Obs) -> str:
    kind, key, exception = error["kind"], error["key"], error["exception"]
    if kind == "missing key":
        return f"the checkpoint has no {key}, which this release's state_dict() names"
    if kind == "size mismatch":
        return f"{key} was saved with another size than this release gives it"
    if kind == "unreadable metadata":
        return f"DCP could not read its .metadata: {exception or 'the error names a file'}"
    if kind == "app load":
        return f"the app's own load() raised {exception}; its traceback is in the worker's log"
    return f"DCP's load raised {exception}; its traceback is in the worker's log"


def _parted(where: str, continued: list[Obs], resumed: list[Obs], loaded_by: str) -> list[str]:
    """Where the resume parts from the other release's own continuation, if it does: both ran
    that release, from the same checkpoint, so only a loop that does not repeat itself parts."""
    found = diagnosis.parting(
        [(s["loss"], s["keys"]) for s in continued], [(s["loss"], s["keys"]) for s in resumed]
    )
    if found is not None:
        index, what = found
        return [
            f"{diagnosis.NONDETERMINISTIC}: {where}: two resumes on torch {loaded_by} from the "
            f"same checkpoint differ at resumed step {index} in {what}; the resume cannot be "
            "judged: seed every generator, draw no unseeded random numbers, keep the thread "
            "count fixed"
        ]
    if len(resumed) != len(continued):
        return [f"{where}: took {len(resumed)} resumed steps, its continuation {len(continued)}"]
    return []


def _release(version: str) -> str:
    """``2.15.0+cu132`` -> ``2.15.0``."""
    return version.split("+", 1)[0]


def _older(release: str, than: str) -> bool:
    try:
        return runtimes.release_key(release) < runtimes.release_key(than)
    except ValueError:
        return False


commits = commit_at_baseline
sightings = fixture_sightings
