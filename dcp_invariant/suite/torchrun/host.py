"""The host of a scenario on one rank of the user's torchrun job (``in-job``).

The family's driver is the one the worker pool runs (:mod:`dcp_invariant.suite.scenarios`); this
host (:class:`.scenarios.host.Host`) makes each of its steps a step of the job:

- a group is this rank running the task, as a pool worker would, then an all-gather: every rank
  holds the whole group's outcome, so every rank's driver takes the same path;
- a commit is rank 0's, once every rank's save has returned (the gather said so); every rank
  then labels digests as rank 0 did, and checks that it sees the pointer rank 0 moved;
- the restart is torchrun's: attempt 0 records each group's outcome and each commit, and stops
  its driver at the restart (:class:`Restarting`). The workers torchrun starts again run the
  driver from the top; their host hands back attempt 0's records, in order, up to the restart,
  and runs what follows. A second launch (``--resume-from``) replays the first launch's source.

Torch is imported only when a collective runs.
"""

from __future__ import annotations

import hashlib
import sys
import traceback
from pathlib import Path
from typing import Any, Protocol

from dcp_invariant import canonical
from dcp_invariant.commit import CheckpointStore, durable
from dcp_invariant.errors import AppRaised, InJobError
from dcp_invariant.evidence.families.records import CommitRecord
from dcp_invariant.suite.pool import GroupOutcome
from dcp_invariant.suite.scenarios.commits import Interner, commit
from dcp_invariant.suite.scenarios.host import Damage
from dcp_invariant.suite.scenarios.payloads import Call

# What a host records, in the order the driver asked: {"group": name, "outcome": GroupRecord},
# or {"commit": label, "record": CommitRecord, "met": the interner's digests, "errors": [...]}.
Entry = dict[str, Any]


class Restarting(BaseException):
    """Attempt 0 reached its scenario's restart: the rest of the driver runs in the workers
    torchrun starts again. A BaseException, so that nothing a driver records as a failure
    (:data:`.scenarios.common.DRIVER_ERRORS`) stops it."""


class Collectives(Protocol):
    """The two collectives the host needs from the job's process group."""

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank."""
        ...

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank."""
        ...


class ProcessGroup:
    """The job's default process group (``torch.distributed``)."""

    def __init__(self, world_size: int) -> None:
        self._world_size = world_size

    def gather(self, value: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self._world_size
        dist.all_gather_object(out, value)
        return out

    def broadcast(self, value: Any) -> Any:
        import torch.distributed as dist

        shared = [value]
        dist.broadcast_object_list(shared, src=0)
        return shared[0]


class TorchrunHost:
    """A scenario's :class:`.scenarios.host.Host` on rank ``rank`` of a job of ``world_size``.

    ``replay``: None on attempt 0, which records (:attr:`recorded`); otherwise what is handed
    back before the restart: attempt 0's records, or in a second launch the first launch's
    source (:func:`resharded`), whose files are under ``source``. Rank 0 writes each commit's
    record to ``commit_file`` as well: a second launch finds a first launch that committed so.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        timeout: float,
        commit_file: Path,
        replay: list[Entry] | None,
        source: Path | None = None,
        collectives: Collectives | None = None,
    ) -> None:
        self.timeout = timeout
        self.recorded: list[Entry] = []
        self._rank = rank
        self._world_size = world_size
        self._commit_file = commit_file
        self._replay = replay
        self._source = source
        self._collectives = collectives or ProcessGroup(world_size)
        self._live = replay is None

    def group(
        self, name: str, call: Call, world_size: int, workdir: Path, *, shareable: bool = False
    ) -> GroupOutcome:
        if not self._live:
            outcome = self._next("group", name)["outcome"]
            return GroupOutcome(
                outcome["exit_codes"],
                outcome["timed_out"],
                outcome["ranks"],
                [],
                raised=outcome.get("raised", []),
            )
        if world_size != self._world_size:
            raise InJobError(
                f"group {name} needs {world_size} ranks; the job has {self._world_size}"
            )
        results = self._collectives.gather(_task(call, self._rank, self._world_size))
        outcome = GroupOutcome(
            exit_codes=[r["exit_code"] for r in results],
            timed_out=False,  # nothing bounds a group as such: --timeout bounds each collective
            results=[r["record"] for r in results if r["record"] is not None],
            logs=[],  # each rank's output is torchrun's
            raised=[r["raised"] for r in results if r["raised"] is not None],
        )
        self.recorded.append({"group": name, "outcome": outcome.record()})
        return outcome

    def commit(
        self, store: CheckpointStore, label: str, intern: Interner, damage: Damage | None
    ) -> tuple[CommitRecord, list[str]]:
        if not self._live:
            entry = self._next("commit", label)
            intern.meet(entry["met"])
            return entry["record"], entry["errors"]
        # Every rank's save has returned: the outcome of each group was gathered from every rank.
        done: dict[str, Any] | None = None
        failed: Exception | None = None
        if self._rank == 0:
            try:
                record = commit(store, label, intern, damage)
                done = {"commit": record, "met": intern.met, "pointer": _digest(store)}
                durable.replace_file(self._commit_file, canonical.dumps(done))
            except Exception as exc:  # every rank must stop here, not this one alone
                done, failed = None, exc
        done = self._collectives.broadcast(done)
        if done is None:
            cause = "" if failed is None else f": {type(failed).__name__}: {failed}"
            raise InJobError(f"rank 0 could not commit {label}{cause}") from failed
        intern.meet(done["met"])
        # Every rank must see the pointer rank 0 moved: a shared filesystem that shows one node
        # an older pointer would have that node resume from another generation.
        errors = pointer_errors(self._collectives.gather(_digest(store) == done["pointer"]))
        entry = {"commit": label, "record": done["commit"], "met": done["met"], "errors": errors}
        self.recorded.append(entry)
        return done["commit"], errors

    def restart(self) -> None:
        if self._replay is None:
            raise Restarting
        if self._live or len(self.recorded) != len(self._replay):
            raise InJobError(
                f"this attempt replayed {len(self.recorded)} of the {len(self._replay)} records "
                "made before its restart: see the first attempt's log"
            )
        self._live = True

    def written(self, workdir: Path, name: str) -> str:
        return name if self._source is None else str(self._source / name)

    @property
    def runs_further(self) -> bool:
        return False  # the resumed group runs after the job's one restart, in the same ranks

    def _next(self, kind: str, name: str) -> Entry:
        """The next record to hand back, which must be ``kind`` named ``name``."""
        assert self._replay is not None
        done = len(self.recorded)
        entry = self._replay[done] if done < len(self._replay) else {}
        if entry.get(kind) != name:
            raise InJobError(
                f"the first attempt's record {done + 1} is not {kind} {name}: it ran another "
                "version of dcp-invariant or another fixture; give a fresh --checkpoint-dir"
            )
        self.recorded.append(entry)
        return entry


def pointer_errors(seen: list[bool]) -> list[str]:
    """The errors of a commit after which some ranks (``seen[rank]`` False) read another pointer."""
    return [
        f"rank {rank}: after the commit it read another pointer than the one rank 0 moved: "
        "the shared filesystem does not show every node the same files"
        for rank, same in enumerate(seen)
        if not same
    ]


def entries(recorded: Any) -> list[Entry]:
    """``recorded``, read back from a rank's file, as the records a host replays."""
    if not isinstance(recorded, list) or not all(isinstance(e, dict) for e in recorded):
        raise InJobError(
            "the first attempt's records were written by another version of dcp-invariant: give "
            "a fresh --checkpoint-dir"
        )
    return recorded


def resharded(first: list[Entry]) -> list[Entry]:
    """What a second launch replays before its restart, from what the first launch's
    ``resume_<a>`` recorded: its source is that launch's reference arm (the N steps, the state
    saved and the K steps after, as a reshard's source is on the pool), then that launch's
    commit."""
    reference = next((e for e in first if e.get("group") == "reference"), None)
    committed = next((e for e in first if "commit" in e), None)
    if reference is None or committed is None:
        raise InJobError("the first launch committed no checkpoint: see its log and its artifact")
    # Whether every rank of the first launch saw its pointer was judged in its own artifact.
    return [reference, {**committed, "errors": []}]


# {"exit_code": 0 or 1, "record": the rank's report or None, "raised": what the user's code
# raised (worker.raised_record) or None}
TaskResult = dict[str, Any]


def _task(call: Call, rank: int, world_size: int) -> TaskResult:
    """Run a task on this rank as a worker of the pool would, catching what it raises."""
    from dcp_invariant.suite import worker

    fn = worker.resolve(call.task)
    reported: list[dict[str, Any]] = []
    try:
        fn(rank, world_size, dict(call.payload), reported.append)
    except AppRaised as exc:
        traceback.print_exception(exc.error, file=sys.stderr)  # the user's frames
        last = reported[-1] if reported else None
        return {"exit_code": 1, "record": last, "raised": worker.raised_record(rank, exc)}
    except Exception as exc:
        # The user wants their loop's frames: print them, and record the rank's failure.
        traceback.print_exception(exc, file=sys.stderr)
        return {"exit_code": 1, "record": reported[-1] if reported else None, "raised": None}
    return {"exit_code": 0, "record": reported[-1] if reported else None, "raised": None}


def _digest(store: CheckpointStore) -> str | None:
    raw = store.pointer_bytes()
    return None if raw is None else hashlib.sha256(raw).hexdigest()
