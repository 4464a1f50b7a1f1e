"""A scenario's commit record of an app's own nested save: paths relative, sorted, canonical."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dcp_invariant import canonical
from dcp_invariant.commit import CheckpointStore
from dcp_invariant.suite import workspace
from dcp_invariant.suite.scenarios.commits import Interner, commit


def nested_save(store: CheckpointStore, label: str) -> Path:
    directory = store.candidate(label)
    (directory / "optim" / "shards").mkdir(parents=True)
    (directory / "empty").mkdir()
    (directory / "model").mkdir()
    (directory / "model" / "weights.pt").write_bytes(b"w" * 5)
    (directory / "optim" / "shards" / "0.pt").write_bytes(b"s")
    (directory / "z.json").write_bytes(b"{}")
    return directory


EXPECTED = [
    {"path": "model/weights.pt", "size": 5},
    {"path": "optim/shards/0.pt", "size": 1},
    {"path": "z.json", "size": 2},
]


def test_a_committed_nested_save_lists_its_files_by_relative_path(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "store", marker=None)
    nested_save(store, "step-1")
    record = commit(store, "step-1", Interner())
    assert record["sealed"] and record["promoted"], record
    assert record["files"] == EXPECTED
    assert str(tmp_path) not in canonical.dumps(record).decode()
    # The workspace goes, read-only subdirectories of the generation and all.
    workspace.remove(store.root)
    assert not store.root.exists()


@pytest.mark.skipif(sys.platform == "win32", reason="symlinks need a privilege on Windows")
def test_a_nested_save_that_cannot_be_sealed_lists_what_it_wrote_at_every_depth(
    tmp_path: Path,
) -> None:
    """What the refused save left is recorded, relative and sorted, without following the link
    it wrote (to a directory outside, whose file must not appear)."""
    store = CheckpointStore(tmp_path / "store", marker=None)
    directory = nested_save(store, "step-1")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.pt").write_bytes(b"x")
    (directory / "optim" / "link").symlink_to(outside, target_is_directory=True)
    record = commit(store, "step-1", Interner())
    assert not record["sealed"]
    assert record["seal_error"] == (
        "optim/link: is a symlink; a checkpoint may hold regular files and directories only"
    )
    assert record["files"] == EXPECTED
