"""half_written's copy of a committed save cut short, on a nested app save: its pure part."""

from __future__ import annotations

from pathlib import Path

from dcp_invariant.commit import CheckpointStore
from dcp_invariant.suite.scenarios.half_written import cut_short

# In name order (relative paths): the first two whole, the third cut to half, the last two
# missing; "model/extra" and "empty" hold nothing the cut keeps.
FILES = {
    "a.json": b"{}",
    "model/extra/x.pt": b"x" * 10,
    "model/weights.pt": b"w" * 9,
    "optim/shards/__0_0.distcp": b"s" * 4,
    "optim/state.pt": b"o" * 6,
}
DIRECTORIES = ["empty", "model", "model/extra", "optim", "optim/shards"]


def test_a_nested_save_is_cut_short_by_relative_path_with_every_directory_made(
    tmp_path: Path,
) -> None:
    store = CheckpointStore(tmp_path / "store", marker=None)
    candidate = store.candidate("step-3")
    for sub in DIRECTORIES:
        (candidate / sub).mkdir(parents=True)
    for name, data in FILES.items():
        (candidate / name).write_bytes(data)
    store.seal("step-3")
    store.promote("step-3")

    target = tmp_path / "cut"
    record = cut_short(store.resolve(), target)

    assert record == {
        "kept": ["a.json", "model/extra/x.pt"],
        "truncated": "model/weights.pt",
        "left_out": ["optim/shards/__0_0.distcp", "optim/state.pt"],
    }
    written = {
        p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()
    }
    assert written == {
        "a.json": b"{}",
        "model/extra/x.pt": b"x" * 10,
        "model/weights.pt": b"w" * 4,  # half of 9 bytes, rounded down
    }
    made = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_dir())
    assert made == DIRECTORIES
