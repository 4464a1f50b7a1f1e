"""Two snapshots of one crash point: one state of the job, or two."""

from __future__ import annotations

import os
from pathlib import Path

from dcp_invariant.preempt.states import first_difference, manifest


def state(root: Path, files: dict[str, bytes], link: str | None = None) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    if link is not None:
        os.symlink(link, root / "latest")
    return root


def test_alike_snapshots_are_one_state(tmp_path: Path) -> None:
    files = {"step-2/.metadata": b"m", "step-2/__0_0.distcp": b"abc"}
    one = state(tmp_path / "a", files, link="step-2")
    two = state(tmp_path / "b", files, link="step-2")
    assert first_difference(one, two) is None
    assert manifest(one) == [
        ("latest", "symlink", 0, "step-2"),
        ("step-2", "directory", 0, ""),
        ("step-2/.metadata", "file", 1, ""),
        ("step-2/__0_0.distcp", "file", 3, ""),
    ]


def test_another_rank_further_on_is_another_state(tmp_path: Path) -> None:
    one = state(tmp_path / "a", {"step-2/__0_0.distcp": b"", "step-2/__1_0.distcp": b"ab"})
    two = state(tmp_path / "b", {"step-2/__0_0.distcp": b"abc", "step-2/__1_0.distcp": b"ab"})
    assert first_difference(one, two) == (
        "step-2/__0_0.distcp: 0 bytes the first time, 3 bytes the second"
    )
    three = state(tmp_path / "c", {"step-2/__1_0.distcp": b"ab"}, link="step-2")
    assert first_difference(one, three) == "latest: absent the first time, -> step-2 the second"


def test_a_temporary_file_is_compared_by_its_shape_not_its_random_name(tmp_path: Path) -> None:
    """safetensors writes model.safetensors as .tmpXXXXXX, another name in every launch."""
    one = state(tmp_path / "a", {"final/.tmpAb12Cd": b"abc", "final/config.json": b"{}"})
    two = state(tmp_path / "b", {"final/.tmpZz99Yy": b"abc", "final/config.json": b"{}"})
    assert first_difference(one, two) is None
    three = state(tmp_path / "c", {"final/.tmpQq11Rr": b"ab", "final/config.json": b"{}"})
    assert first_difference(one, three) == "final/tmp*: 3 bytes the first time, 2 bytes the second"
