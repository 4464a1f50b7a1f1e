"""Two real processes promote into one store at once: exactly one wins, the other is told why.

The order is fixed (see ``race_publisher.py``): the first publisher holds the lock at the moment
it would write the pointer until the second has been refused the lock, so every run exercises
the case a lost update needs, and its outcome is certain: the first wins at parent + 1, the
second gets StaleParent naming both pointers, and its generation stays on disk, unselected.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from commit_helpers import commit, write_candidate

from dcp_invariant.commit import CheckpointStore

PUBLISHER = Path(__file__).with_name("race_publisher.py")
RUNS = 30
WAIT_SECONDS = 20.0
WAIT = str(WAIT_SECONDS)


@pytest.mark.parametrize("run", range(RUNS))
def test_two_publishers_one_wins_and_the_other_is_a_stale_parent(tmp_path: Path, run: int) -> None:
    store = CheckpointStore(tmp_path / "store")
    # Half the runs race on an empty store, half on top of a generation; the winner's label
    # alternates so that neither name nor receipt digest decides the order.
    if run % 2:
        commit(store, "step-0")
    parent = store.read_pointer()
    labels = ("alpha", "beta") if run % 4 < 2 else ("beta", "alpha")
    for label in labels:
        write_candidate(store, label)
    sync = tmp_path / "sync"
    sync.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, str(PUBLISHER), str(store.root), label, role, str(sync), WAIT],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=tmp_path,
        )
        for label, role in zip(labels, ("first", "second"), strict=True)
    ]
    try:
        outputs = [proc.communicate(timeout=3 * WAIT_SECONDS) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    for proc, (_, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err.decode(errors="replace")
    first, second = (json.loads(out) for out, _ in outputs)

    assert first["outcome"] == "promoted", first
    assert first["second_was_blocked"], "the second publisher never waited for the lock"
    assert second["outcome"] == "StaleParent", second
    published = store.pointer_bytes()
    assert published is not None
    assert second["expected"] == (None if parent is None else parent.digest)
    assert second["actual"] == hashlib.sha256(published).hexdigest()
    current = store.read_pointer()
    assert current is not None
    assert (current.label, current.sequence) == (labels[0], (parent.sequence if parent else 0) + 1)
    assert store.resolve().digest == first["generation"]
    assert second["generation"] in store.generation_names()
    assert second["generation"] != first["generation"]
