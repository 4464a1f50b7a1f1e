"""What the console shows of failing scenarios' worker logs (torch-free)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dcp_invariant
from dcp_invariant.suite.console import CAP, DEBUG_HINT, Log, ShownLogs, library_roots

TORCH = "/venv/lib/python3.11/site-packages/torch"
TOOL = "/venv/lib/python3.11/site-packages/dcp_invariant"

TRACEBACK = f"""\
Traceback (most recent call last; dcp-invariant's own frames left out):
  File "/home/u/proj/loop.py", line 40, in step
    loss = self.model(x)
           ^^^^^^^^^^^^^
  File "{TORCH}/nn/modules/module.py", line 1775, in _call_impl
    return forward_call(*args, **kwargs)
  File "/home/u/proj/model.py", line 12, in forward
    raise ValueError("boom")
ValueError: boom
"""
BACKGROUND = "Checkpoint background process is running...\n"


def shown(cap: int | None = CAP) -> ShownLogs:
    return ShownLogs(cap=cap, hidden=(TORCH, TOOL))


def test_the_fixtures_traceback_tail_comes_first_without_torchs_frames() -> None:
    logs = [Log("reference-rank0.log", BACKGROUND + "some warning\n" + TRACEBACK)]
    lines = shown().excerpt(logs)
    assert lines[:7] == [
        "traceback, the fixture's frames (reference-rank0.log):",
        '  File "/home/u/proj/loop.py", line 40, in step',
        "    loss = self.model(x)",
        "           ^^^^^^^^^^^^^",
        '  File "/home/u/proj/model.py", line 12, in forward',
        '    raise ValueError("boom")',
        "ValueError: boom",
    ]
    # Then what the log says besides, each line once: torch's frame is there, not repeated ones.
    assert lines[7:] == [
        "--- reference-rank0.log",
        "Checkpoint background process is running...",
        "some warning",
        f'  File "{TORCH}/nn/modules/module.py", line 1775, in _call_impl',
        "    return forward_call(*args, **kwargs)",
    ]


def test_the_last_traceback_of_the_first_log_that_has_one_is_the_cause() -> None:
    chained = (
        TRACEBACK
        + "\nDuring handling of the above exception, another exception occurred:\n\n"
        + 'Traceback (most recent call last):\n  File "/home/u/proj/loop.py", line 50, in step\n'
        + "    self.cleanup()\nRuntimeError: cleanup failed\n"
    )
    logs = [
        Log("", "TypeError: a driver note without a traceback"),
        Log("reference-rank0.log", chained),
        Log(
            "target-rank0.log",
            'Traceback (most recent call last):\n  File "/o.py", line 1\nOSError\n',
        ),
    ]
    lines = shown().excerpt(logs)
    assert lines[:4] == [
        "traceback, the fixture's frames (reference-rank0.log):",
        '  File "/home/u/proj/loop.py", line 50, in step',
        "    self.cleanup()",
        "RuntimeError: cleanup failed",
    ]
    # A note has no header; it is shown before the logs.
    assert lines[4] == "TypeError: a driver note without a traceback"


def test_a_traceback_of_only_the_tools_and_torchs_frames_shows_its_exception_line() -> None:
    text = f'Traceback (most recent call last):\n  File "{TOOL}/suite/worker.py", line 1, in run\n'
    text += "    fn()\nKeyError: 'x'\n"
    lines = shown().excerpt([Log("reference-rank0.log", text)])
    assert lines[:2] == ["traceback, the fixture's frames (reference-rank0.log):", "KeyError: 'x'"]


def test_each_distinct_line_is_shown_once_across_ranks_and_scenarios() -> None:
    console = shown()
    same = BACKGROUND + TRACEBACK
    first = console.excerpt([Log("reference-rank0.log", same), Log("reference-rank1.log", same)])
    assert first.count("ValueError: boom") == 1
    assert first.count("Checkpoint background process is running...") == 1
    assert "--- reference-rank1.log" not in first  # it had nothing new to say
    # A later scenario failing the same way repeats nothing, and says so.
    assert console.excerpt([Log("reference-rank0.log", same)]) == [
        "(its logs repeat lines shown above)"
    ]
    # Only its new lines are shown; its traceback tail was shown already.
    later = console.excerpt([Log("target-rank0.log", same + "a new line\n")])
    assert later == ["--- target-rank0.log", "a new line"]


def test_a_passing_scenario_or_empty_logs_show_nothing() -> None:
    assert shown().excerpt([]) == []
    assert shown().excerpt([Log("reference-rank0.log", "\n  \n")]) == []


def test_the_lines_are_capped_keeping_each_logs_end_and_say_how_many_were_left_out() -> None:
    long = "".join(f"line {i}\n" for i in range(100))
    short = "short 1\nshort 2\n"
    lines = shown(cap=10).excerpt([Log("a.log", long), Log("b.log", short)])
    # The short log keeps its two lines, the long one the rest of the cap: its last eight.
    assert lines == [
        "--- a.log",
        *(f"line {i}" for i in range(92, 100)),
        "--- b.log",
        "short 1",
        "short 2",
        f"... 92 more lines left out; {DEBUG_HINT}",
    ]


def test_the_traceback_tail_counts_against_the_cap() -> None:
    long = "".join(f"line {i}\n" for i in range(100)) + TRACEBACK
    lines = shown(cap=10).excerpt([Log("a.log", long)])
    body = lines[lines.index("--- a.log") + 1 : -1]
    assert len(body) == 10 - 6  # six lines of traceback tail
    assert body == [f"line {i}" for i in range(98, 100)] + [
        f'  File "{TORCH}/nn/modules/module.py", line 1775, in _call_impl',
        "    return forward_call(*args, **kwargs)",
    ]
    assert lines[-1].startswith("... ") and DEBUG_HINT in lines[-1]


def test_without_a_cap_every_distinct_line_is_shown() -> None:
    long = "".join(f"line {i}\n" for i in range(100))
    lines = shown(cap=None).excerpt([Log("a.log", long + long)])
    assert lines == ["--- a.log", *(f"line {i}" for i in range(100))]


def test_the_default_cap_holds_for_many_ranks_full_of_distinct_lines() -> None:
    logs = [Log(f"source-rank{r}.log", f"rank {r} says one thing\n") for r in range(8)]
    logs += [Log("reference-rank0.log", "".join(f"x {i}\n" for i in range(200)))]
    lines = shown().excerpt(logs)
    assert sum(not line.startswith(("--- ", "... ")) for line in lines) == CAP
    assert lines[-1] == f"... {8 + 200 - CAP} more lines left out; {DEBUG_HINT}"


def test_library_roots_name_this_package_without_importing_torch() -> None:
    package = str(Path(dcp_invariant.__file__).resolve().parent)
    assert package in library_roots()
    code = (
        "import sys\nfrom dcp_invariant.suite import console\nconsole.library_roots()\n"
        "assert 'torch' not in sys.modules, 'imported torch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
