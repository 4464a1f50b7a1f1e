"""Checkpoints written by real ``dcp.save`` (torch, Gloo on loopback, FSDP2 at world sizes 1, 2
and 4) pass ``inspect``, read as torch reads them, and are caught when damaged."""

from __future__ import annotations

import dataclasses
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from dcp_writer import TEST_DATA, data_file_name, write_checkpoint
from metadata_pickler import dumps

from dcp_invariant.inspection import inspect_checkpoint, metadata, records
from dcp_invariant.inspection.errors import MetadataProblem

# Every test reads the checkpoints the module writes once: one pytest-xdist worker runs them all
# (--dist loadgroup).
pytestmark = [pytest.mark.live, pytest.mark.xdist_group("inspect_written")]

WORLD_SIZES = (1, 2, 4)
CLI_TIMEOUT = 120


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """One checkpoint per world size, saved as ``checkpoint`` relative to its own directory,
    as ``dcp_writer.py --test-data`` saves the checked-in metadata."""
    pytest.importorskip("torch")
    out = {}
    for world_size in WORLD_SIZES:
        work = tmp_path_factory.mktemp(f"ws{world_size}")
        write_checkpoint(Path("checkpoint"), world_size, cwd=work)
        out[world_size] = work / "checkpoint"
    return out


def torch_metadata(directory: Path) -> Any:
    # What FileSystemReader.read_metadata does: trusted here, as the file is this test's own.
    with open(directory / ".metadata", "rb") as f:
        return pickle.load(f)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_a_real_save_passes_inspect(written: dict[int, Path], world_size: int) -> None:
    report = inspect_checkpoint(written[world_size], world_size=2)
    assert report.problems == ()
    assert report.contents is not None and len(report.contents.files) == world_size
    done = subprocess.run(
        [sys.executable, "-m", "dcp_invariant", "inspect", str(written[world_size])],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "verdict: sound"


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_the_records_are_what_torch_unpickles(written: dict[int, Path], world_size: int) -> None:
    mine = metadata.read(written[world_size] / ".metadata")
    theirs = torch_metadata(written[world_size])
    assert list(mine.state_dict_metadata) == list(theirs.state_dict_metadata)
    for key, item in theirs.state_dict_metadata.items():
        if hasattr(item, "chunks"):
            ours = mine.state_dict_metadata[key]
            assert isinstance(ours, records.TensorStorageMetadata)
            assert ours.size == tuple(item.size)
            assert f"torch.{ours.properties.dtype.name}" == str(item.properties.dtype)
            assert f"torch.{ours.properties.layout.name}" == str(item.properties.layout)
            assert [(c.offsets, c.sizes) for c in ours.chunks] == [
                (tuple(c.offsets), tuple(c.sizes)) for c in item.chunks
            ]
        else:
            assert isinstance(mine.state_dict_metadata[key], records.BytesStorageMetadata)
    assert mine.storage_data is not None
    assert [
        (i.fqn, i.offset, i.index, s.relative_path, s.offset, s.length)
        for i, s in mine.storage_data.items()
    ] == [
        (
            i.fqn,
            None if i.offset is None else tuple(i.offset),
            i.index,
            s.relative_path,
            s.offset,
            s.length,
        )
        for i, s in theirs.storage_data.items()
    ]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_records_pickled_back_load_in_torch_as_the_original(
    written: dict[int, Path], world_size: int
) -> None:
    theirs = torch_metadata(written[world_size])
    again = pickle.loads(dumps(metadata.read(written[world_size] / ".metadata")))
    assert again.state_dict_metadata == theirs.state_dict_metadata
    assert again.storage_data == theirs.storage_data
    assert again.storage_meta == theirs.storage_meta


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_torchs_own_objects_read_at_every_protocol_python_can_write(
    written: dict[int, Path], protocol: int
) -> None:
    expected = metadata.read(written[2] / ".metadata")
    data = pickle.dumps(torch_metadata(written[2]), protocol=protocol)
    if protocol < 2:
        # A dataclass below protocol 2 is rebuilt by calling copyreg._reconstructor.
        with pytest.raises(MetadataProblem, match=r"global copyreg\._reconstructor"):
            metadata.parse(data)
    else:
        assert metadata.parse(data) == expected


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_the_checked_in_metadata_is_what_this_torch_writes(
    written: dict[int, Path], world_size: int
) -> None:
    def without_save_id(meta: records.Metadata) -> records.Metadata:
        assert meta.storage_meta is not None
        return dataclasses.replace(
            meta, storage_meta=dataclasses.replace(meta.storage_meta, save_id=None)
        )

    fresh = metadata.read(written[world_size] / ".metadata")
    checked_in = metadata.read(TEST_DATA / data_file_name(world_size))
    assert without_save_id(fresh) == without_save_id(checked_in)


def test_damage_to_a_real_checkpoint_is_named(written: dict[int, Path], tmp_path: Path) -> None:
    cases = {}
    for case in ("removed", "truncated", "symlinked"):
        target = tmp_path / case
        shutil.copytree(written[4], target)
        cases[case] = target
    (cases["removed"] / "__2_0.distcp").unlink()
    size = os.path.getsize(cases["truncated"] / "__3_0.distcp")
    os.truncate(cases["truncated"] / "__3_0.distcp", size // 2)
    (cases["symlinked"] / "__1_0.distcp").rename(tmp_path / "moved.distcp")
    (cases["symlinked"] / "__1_0.distcp").symlink_to(tmp_path / "moved.distcp")

    def said(case: str) -> list[str]:
        return [str(p) for p in inspect_checkpoint(cases[case]).problems]

    assert [p.split(" (")[0] for p in said("removed")] == ["missing file: __2_0.distcp"]
    (truncated,) = said("truncated")
    assert truncated.startswith(f"truncated: __3_0.distcp holds {size // 2} bytes; ")
    assert [p.split(" (")[0] for p in said("symlinked")] == [
        "not a regular file: __1_0.distcp is a symlink"
    ]
