"""Where a scenario's groups run: what a family's driver asks of it, and this machine's pool.

A driver (:mod:`dcp_invariant.suite.scenarios`) is written once, against :class:`Host`, and
runs on either of two hosts:

- :class:`PoolHost`, this machine's worker pool (``run``, ``check()``, the pytest plugin): the
  runner starts each group as fresh processes and commits in its own process;
- ``TorchrunHost`` (:mod:`dcp_invariant.suite.torchrun.host`), every rank of the user's own
  torchrun job (``in-job``): the rank is one of each group's ranks, rank 0 commits, torchrun
  restarts every worker, and the restarted workers replay what came before the restart.

What differs between them is all here: running a group or being one of its ranks, the moment
every rank's save has returned, the one process that commits, the restart, and where the files
of groups run before it are. Torch-free, as every driver is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dcp_invariant.commit import CheckpointStore
from dcp_invariant.evidence.families.records import CommitRecord
from dcp_invariant.suite.pool import GroupOutcome, WorkerPool
from dcp_invariant.suite.scenarios.commits import Interner, commit
from dcp_invariant.suite.scenarios.payloads import Call
from dcp_invariant.suite.scenarios.shared_groups import SharedGroups
from dcp_invariant.suite.torchrun.agent import Agent

Damage = Callable[[Path], None]  # acts on a sealed candidate before its promotion


class Host(Protocol):
    """What a driver asks of the processes that run its scenario."""

    @property
    def timeout(self) -> float:
        """Seconds a group (pool) or a collective (torchrun job) may take; async saves wait as
        long for their write."""
        ...

    def group(
        self, name: str, call: Call, world_size: int, workdir: Path, *, shareable: bool = False
    ) -> GroupOutcome:
        """Run ``call`` on ``world_size`` ranks working in ``workdir`` (or hand back the outcome an
        earlier process recorded, see :meth:`restart`). Every caller gets the whole group's
        outcome, once every rank has finished: its saves are on disk.

        ``shareable``: another scenario's identical group may have run it already
        (:mod:`.shared_groups`); only the pool shares.
        """
        ...

    def commit(
        self, store: CheckpointStore, label: str, intern: Interner, damage: Damage | None
    ) -> tuple[CommitRecord, list[str]]:
        """Seal ``label`` in ``store``, let ``damage`` act on it, try to promote it: once, in one
        process (:func:`.commits.commit`). The record every caller gets, with ``intern`` as the
        committing process left it, and the errors the host found (a rank of a job that does not
        see the pointer the commit moved)."""
        ...

    def restart(self) -> None:
        """From here on, groups run in processes that ran none of the scenario's groups before.

        The pool starts every group afresh: nothing to do. In a torchrun job, the first attempt
        ends here and torchrun restarts every worker; the restarted workers run the driver again
        from the top, and the host hands back what each group and commit before this call
        recorded instead of running them again.
        """
        ...

    def written(self, workdir: Path, name: str) -> str:
        """How a task finds ``name`` (relative to ``workdir``), a file the scenario's groups
        wrote: relative, unless those groups ran in another launch's directory."""
        ...

    @property
    def runs_further(self) -> bool:
        """Whether a resume may run both arms again, longer, after its resumed group (where
        only generators differ at the end, :func:`.resume.run`): every group then is fresh
        processes. A torchrun job restarts its workers once, before the resumed group."""
        ...


@dataclass(frozen=True)
class PoolHost:
    """This machine's worker pool: every group is fresh processes, and the runner commits."""

    pool: WorkerPool
    shared: SharedGroups | None = None  # None: every group runs for its scenario alone
    # The torchrun agent the runner started ahead of need, in the restart scenario's workdir.
    agent: Agent | None = None

    @property
    def timeout(self) -> float:
        return self.pool.timeout

    def group(
        self, name: str, call: Call, world_size: int, workdir: Path, *, shareable: bool = False
    ) -> GroupOutcome:
        if shareable and self.shared is not None:
            return self.shared.run(self.pool, call, world_size, workdir, name)
        return self.pool.run_group(call, world_size, workdir, name)

    def commit(
        self, store: CheckpointStore, label: str, intern: Interner, damage: Damage | None
    ) -> tuple[CommitRecord, list[str]]:
        # What the copy of a shared group's save left out (a FIFO, a socket, a device) is
        # refused as the seal refuses it where the save wrote it.
        refused = None if self.shared is None else self.shared.refused(store.candidate(label))
        return commit(store, label, intern, damage, refused), []

    def restart(self) -> None:
        pass  # every group is fresh processes already

    def written(self, workdir: Path, name: str) -> str:
        return name  # every task works in the scenario's workspace

    @property
    def runs_further(self) -> bool:
        return True


@dataclass(frozen=True)
class ReleaseHost:
    """Where a cross_release scenario's loading groups run: ``host``, whose ranks import
    another torch release (:mod:`dcp_invariant.suite.release_env`); what each side reports as
    ``torch.__version__``, for the record."""

    host: Host
    saved_torch: str
    loaded_torch: str
