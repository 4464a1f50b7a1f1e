"""A fixture whose async saves stage nothing, so their write reads the tensors late.

The live tests use it (``lazy_staging:correct``) to show that a save which reads the tensors
after step N+1 has moved them is caught. The tool never stages that way: building this app in
a worker puts a stager that copies nothing in place of the tool's own, for that worker alone
(each group's workers are fresh processes). It is not in ``fixture_loops``, which imports
nothing from the package.
"""

from __future__ import annotations

from typing import Any

from fixture_loops import Correct

from dcp_invariant.ranks import fixture_tasks


class LazyStager:
    """Stages nothing: the write reads the live tensors when it runs, after the next step."""

    should_synchronize_after_execute = False

    def stage(self, state_dict: Any) -> Any:
        return state_dict

    def synchronize_staging(self) -> None:
        return None

    def close(self) -> None:
        return None


def lazy_stager(mode: str) -> LazyStager:
    return LazyStager()  # whatever the mode: thread, staged or process


def correct(rank: int, world_size: int) -> Correct:
    """fixture_loops' correct loop, in a worker whose async saves now stage nothing."""
    fixture_tasks.stager = lazy_stager
    return Correct(rank, world_size)
