"""What the console shows of a failing scenario's worker logs.

Every rank of every group writes a log, and a failing loop fails alike in each of them: shown
whole, one run printed 128 lines, most of them DCP's "Checkpoint background process is
running..." and the same warnings again. So a failing scenario shows, first, the tail of the
fixture's own traceback (its frames, not this tool's or torch's, and the exception line), then
the log lines no earlier scenario of the run has shown, at most :data:`CAP` of them. The logs
themselves go with the run's workspace; ``dcp-invariant --debug run`` lifts the cap instead.
Needs only the standard library: the runner process never imports torch.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# Lines per failing scenario, its traceback tail included: the tail of one traceback and the
# first lines that explain it, not a page per scenario.
CAP = 25
# The innermost frames of the fixture's traceback: where its code raised and what called that.
TRACEBACK_FRAMES = 5
DEBUG_HINT = "rerun as `dcp-invariant --debug run ...` to show every line"

_TRACEBACK = "Traceback (most recent call last"
_FRAME = re.compile(r'  File "(?P<file>[^"]+)", line \d+')


@dataclass(frozen=True)
class Log:
    """One worker's log (``name``: its file, e.g. ``reference-rank0.log``), or a note of the
    runner's own (``name`` empty: an exception a driver met, torchrun's output)."""

    name: str
    text: str


def library_roots() -> tuple[str, ...]:
    """The directories of dcp-invariant and of torch, whose frames are not the fixture's.

    ``find_spec`` locates torch without importing it (the runner must not).
    """
    roots = [str(Path(__file__).resolve().parent.parent)]
    torch = importlib.util.find_spec("torch")
    if torch is not None and torch.submodule_search_locations:
        roots += [str(Path(p).resolve()) for p in torch.submodule_search_locations]
    return tuple(roots)


class ShownLogs:
    """The log lines one run has shown so far, and what each failing scenario adds to them.

    ``cap``: lines per scenario (None: all of them; each distinct line is still shown once).
    ``hidden``: directories whose traceback frames are the tool's or torch's.
    """

    def __init__(self, cap: int | None = CAP, hidden: Sequence[str] | None = None) -> None:
        self.cap = cap
        self.hidden = tuple(library_roots() if hidden is None else hidden)
        self._shown: set[str] = set()

    def excerpt(self, logs: Iterable[Log]) -> list[str]:
        """The lines to print for one failing scenario's logs, in order."""
        logs = [log for log in logs if log.text.strip()]
        if not logs:
            return []
        budget = self.cap
        out: list[str] = []
        tail = self._traceback_tail(logs)
        if tail is not None:
            source, header, lines = tail
            if not all(_key(line) in self._shown for line in lines):
                out.append(f"traceback, the fixture's frames ({source}):")
                out += lines
                budget = None if budget is None else max(budget - len(lines), 0)
            # Its header would only introduce frames shown already.
            self._shown.update(map(_key, [header, *lines]))
        # Each log's lines not shown before (by this scenario's other logs either).
        fresh: list[tuple[str, list[str]]] = []
        for log in logs:
            lines = []
            for line in log.text.splitlines():
                key = _key(line)
                if key and key not in self._shown:
                    self._shown.add(key)
                    lines.append(line.rstrip())
            if lines:
                fresh.append((log.name, lines))
        shares = _shares([len(lines) for _, lines in fresh], budget)
        left_out = 0
        for (name, lines), share in zip(fresh, shares, strict=True):
            left_out += len(lines) - share
            if share:
                if name:
                    out.append(f"--- {name}")
                # The end of a log is where it failed.
                out += lines[len(lines) - share :]
        if left_out:
            out.append(f"... {left_out} more lines left out; {DEBUG_HINT}")
        if not out:
            out.append("(its logs repeat lines shown above)")
        return out

    def _traceback_tail(self, logs: Sequence[Log]) -> tuple[str, str, list[str]] | None:
        """The first log's last traceback, cut to the fixture's innermost frames and the
        exception line: the first group to fail is the cause, later ones only did not run."""
        for log in logs:
            lines = log.text.splitlines()
            starts = [i for i, line in enumerate(lines) if line.startswith(_TRACEBACK)]
            if not starts:
                continue
            frames: list[list[str]] = []
            i = starts[-1] + 1
            while i < len(lines) and lines[i].startswith("  "):
                match = _FRAME.match(lines[i])
                if match:
                    frames.append([] if self._is_hidden(match["file"]) else [lines[i]])
                elif frames and frames[-1]:
                    frames[-1].append(lines[i])  # the frame's source line and its carets
                i += 1
            exception = [lines[i].rstrip()] if i < len(lines) and lines[i].strip() else []
            theirs = [frame for frame in frames if frame][-TRACEBACK_FRAMES:]
            shown = [line.rstrip() for frame in theirs for line in frame] + exception
            if shown:
                return log.name or "note", lines[starts[-1]], shown
        return None

    def _is_hidden(self, filename: str) -> bool:
        if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
            return True
        paths = {filename, os.path.realpath(filename)}
        return any(p.startswith(root + os.sep) for p in paths for root in self.hidden)


def _key(line: str) -> str:
    """Lines that differ only in trailing blanks are the same line; a blank one is no line."""
    return line.rstrip()


def _shares(sizes: Sequence[int], budget: int | None) -> list[int]:
    """How many lines each log keeps: a fair share of the budget each, what a short log leaves
    going to the others (water-filling, smallest first)."""
    if budget is None:
        return list(sizes)
    shares = [0] * len(sizes)
    pending = sorted(range(len(sizes)), key=lambda i: sizes[i])
    for taken, i in enumerate(pending):
        shares[i] = min(sizes[i], budget // (len(pending) - taken))
        budget -= shares[i]
    return shares
