"""``dcp-invariant inspect``: exit codes, one-line bad input, canonical ``--json``, no torch."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from inspect_data import edited, make_checkpoint, tensor
from metadata_pickler import memo_bomb

from dcp_invariant import canonical, cli
from dcp_invariant.inspection import records

SUBPROCESS_TIMEOUT = 120


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli.main(["inspect", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_sound_checkpoint_exits_0_with_a_short_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", 2)
    code, out, err = run(capsys, str(directory))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"checkpoint: {directory}"
    assert (
        lines[1] == "keys: 42 (26 tensors in 38 chunks, 16 byte items); DCP metadata version 1.0.0"
    )
    assert lines[2].startswith("bytes: ") and " in 2 files of " in lines[2]
    assert lines[-1] == "verdict: sound"


def test_problems_exit_1_each_on_a_line_of_its_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", 4)
    (directory / "__3_0.distcp").unlink()
    with open(directory / "__1_0.distcp", "r+b") as f:
        f.truncate(100)
    code, out, _ = run(capsys, str(directory))
    assert code == 1
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert [p.split(":")[1].strip() for p in problems] == ["truncated", "missing file"]
    assert out.splitlines()[-1] == "verdict: 2 problems"


def test_a_hostile_pickle_exits_1_naming_the_global(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = make_checkpoint(
        tmp_path / "ckpt", 1, b"\x80\x02cposix\nsystem\nX\x01\x00\x00\x00xR."
    )
    code, out, err = run(capsys, str(directory))
    assert (code, err) == (1, "")
    assert "problem: refused pickle: global posix.system" in out.splitlines()


@pytest.mark.parametrize(
    ("target", "says"),
    [
        ("absent", "does not exist: pass the directory dcp.save wrote (checkpoint_id)"),
        ("file", "is not a directory: pass the directory dcp.save wrote (checkpoint_id)"),
        ("empty", "has no .metadata: pass the directory dcp.save wrote (checkpoint_id)"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, says: str
) -> None:
    (tmp_path / "file").write_bytes(b"")
    (tmp_path / "empty").mkdir()
    code, out, err = run(capsys, str(tmp_path / target))
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"dcp-invariant: error: {tmp_path / target} {says}")


@pytest.mark.parametrize("value", ["0", "-1", "70000"])
def test_a_world_size_out_of_range_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", 1)
    code, out, err = run(capsys, str(directory), "--world-size", value)
    assert (code, out) == (2, "")
    assert (
        err
        == f"dcp-invariant: error: --world-size {value}: give a number of ranks from 1 to 65536\n"
    )


def test_json_is_one_canonical_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", 2)
    (directory / "__0_0.distcp").unlink()
    code, out, _ = run(capsys, str(directory), "--json", "--world-size", "4")
    assert code == 1
    raw = out.encode("utf-8")
    record = canonical.loads(raw)  # refuses anything but the canonical encoding
    assert canonical.dumps(record) == raw
    assert record["schema"] == "dcp-invariant/inspect/1"
    assert record["sound"] is False
    assert [p.split(":")[0] for p in record["problems"]] == ["missing file"]
    assert record["contents"]["files"][0] == {"path": "__0_0.distcp", "size": None}
    assert record["estimate"]["world_size"] == 4 and len(record["estimate"]["bytes_per_rank"]) == 4
    assert record["estimate"]["note"].startswith("an estimate: ")


def test_the_estimate_says_it_is_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", 2)
    code, out, _ = run(capsys, str(directory), "--world-size", "3")
    assert code == 0
    assert "at world size 3, an estimate: sharded tensors split along dim 0 as FSDP2 does" in out
    assert "  largest tensor: model.0.weight (10, 8) float32, " in out


_ALLOWED_CHECK = r"""
import json, sys
before = set(sys.modules)
from dcp_invariant import cli
rc = cli.main(["inspect", sys.argv[1], "--world-size", "2"])
third_party = sorted(
    m for m in set(sys.modules) - before
    if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "dcp_invariant"
)
ours = sorted(m for m in sys.modules if m.split(".")[0] == "dcp_invariant")
print(json.dumps({"rc": rc, "third_party": third_party, "ours": ours}))
"""


def test_inspect_loads_no_torch_and_only_the_standard_library(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", 2)
    done = subprocess.run(
        [sys.executable, "-c", _ALLOWED_CHECK, str(directory)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.splitlines()[-1])
    assert outcome["rc"] == 0  # inspect really ran and passed, so the empty list means something
    assert "dcp_invariant.inspection.unpickler" in outcome["ours"]
    assert outcome["third_party"] == []
    assert not [m for m in outcome["ours"] if m.startswith("dcp_invariant.suite")]


def test_the_console_script_exits_as_main_does(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", 1)
    command = [sys.executable, "-m", "dcp_invariant", "inspect"]
    sound = subprocess.run(
        [*command, str(directory)], capture_output=True, timeout=SUBPROCESS_TIMEOUT, check=False
    )
    missing = subprocess.run(
        [*command, str(tmp_path / "absent")],
        capture_output=True,
        timeout=SUBPROCESS_TIMEOUT,
        check=False,
    )
    assert (sound.returncode, missing.returncode) == (0, 2)
    assert missing.stderr.count(b"\n") == 1 and b"Traceback" not in missing.stderr


# --- numbers out of range and records past the budget, in every output mode ------------------

_MODES = {"text": (), "json": ("--json",), "estimate": ("--world-size", "3")}


def _length(value: int) -> bytes:
    def change(meta: records.Metadata) -> records.Metadata:
        assert meta.storage_data is not None
        index = records.MetadataIndex("extra.step")
        storage = dict(meta.storage_data)
        storage[index] = dataclasses.replace(storage[index], length=value)
        return dataclasses.replace(meta, storage_data=storage)

    return edited(1, change)


def _size(size: tuple[int, ...]) -> bytes:
    def change(meta: records.Metadata) -> records.Metadata:
        state = dict(meta.state_dict_metadata)
        state["plain.f32"] = dataclasses.replace(tensor(meta, "plain.f32"), size=size)
        return dataclasses.replace(meta, state_dict_metadata=state)

    return edited(1, change)


_HOSTILE: dict[str, tuple[Callable[[], bytes], str]] = {
    "length 2**2000": (lambda: _length(2**2000), "bad value: storage_data['extra.step'].length"),
    "length 2**20000": (lambda: _length(2**20000), "bad value: storage_data['extra.step'].length"),
    "shape (2**63+1, 4)": (
        lambda: _size((2**63 + 1, 4)),
        "bad value: state_dict_metadata['plain.f32'].size[0] is 9223372036854775809",
    ),
    "shape of 4400 digits": (
        lambda: _size((2**62,) * 240),
        "bad value: state_dict_metadata['plain.f32'].size (",
    ),
    "memo bomb": (lambda: memo_bomb(100_000, 30_000), "too large: state_dict_metadata['bomb']"),
}


@pytest.mark.parametrize("mode", _MODES)
@pytest.mark.parametrize("case", _HOSTILE)
def test_bad_values_and_budget_exit_1_with_the_reason_in_every_mode(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, mode: str
) -> None:
    build, says = _HOSTILE[case]
    directory = make_checkpoint(tmp_path / "ckpt", 1, build())
    code, out, err = run(capsys, str(directory), *_MODES[mode])
    assert (code, err) == (1, "")
    if mode == "json":
        record = canonical.loads(out.encode("utf-8"))
        problems = record["problems"]
        assert record["sound"] is False and record["contents"] is None
    else:
        lines = out.splitlines()
        problems = [
            line.removeprefix("problem: ") for line in lines if line.startswith("problem: ")
        ]
        assert out.splitlines()[-1] == "verdict: 1 problem"
    assert len(problems) == 1 and problems[0].startswith(says), problems


def test_the_console_script_refuses_the_memo_bomb(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path / "ckpt", 1, memo_bomb(100_000, 30_000))
    done = subprocess.run(
        [sys.executable, "-m", "dcp_invariant", "inspect", str(directory)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        check=False,
    )
    assert done.returncode == 1 and done.stderr == ""
    assert "problem: too large: state_dict_metadata['bomb'].chunks[" in done.stdout
