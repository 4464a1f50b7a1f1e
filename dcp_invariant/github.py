"""The GitHub Actions job summary and step outputs for an evidence artifact.

Everything the composite action shows is derived here, by the verifier, from the artifact on
disk: the shell steps only call ``dcp-invariant github-report``. Imports no torch.

A directory holding ``preempt.json`` (the action's ``preempt-command``) is ``preempt``'s
evidence: its outputs and summary count crash points, as ``dcp-invariant verify`` derives them.
"""

from __future__ import annotations

import hashlib
import html
import os
import platform
import re
import secrets
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dcp_invariant import plan, regular_file
from dcp_invariant.errors import ArtifactNameError, UseNumberError
from dcp_invariant.evidence import rules, schema
from dcp_invariant.evidence.verify import Verification, verify_artifact

MAX_REASON_CHARS = 300
# actions/upload-artifact refuses these in a name.
_BAD_NAME_CHARS = re.compile(r'["<>|*?:\\/\r\n]')


def artifact_name(given: str, torch_version: str, env: Mapping[str, str], use: int = 1) -> str:
    """``given``, or a default unique per job of a matrix over runner, Python and torch, per
    attempt, and per use of the action in the job.

    Upload fails on a name already used in the workflow run (actions/upload-artifact v4 and
    later), so a matrix cannot share one, nor two uses in one job: the second and later uses
    add ``-use<n>``. RUNNER_OS alone does not tell ubuntu-22.04 from ubuntu-24.04, or x64 from
    arm64: the architecture (RUNNER_ARCH) and the runner image (ImageOS) are part of the name.
    """
    # Checked even when a name is given: a count below 1 is a caller's mistake either way.
    if isinstance(use, bool) or not isinstance(use, int) or use < 1:
        raise UseNumberError(
            f"--use {use!r}: which use of the action in the job this is, counted from 1 (the "
            "action's venv step gives it): pass 1 or more"
        )
    if given:
        bad = sorted(set(_BAD_NAME_CHARS.findall(given)))
        if bad or len(given) > 200:
            raise ArtifactNameError(
                f"artifact-name {given!r} is not usable: drop {bad or 'characters past 200'}"
            )
        return given
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    parts = [
        "dcp-invariant",
        env.get("GITHUB_JOB", "local"),
        env.get("RUNNER_OS", platform.system()),
        env.get("RUNNER_ARCH", platform.machine() or "unknown"),
        env.get("ImageOS", "local"),
        f"py{python}",
        f"torch{torch_version or 'default'}",
        f"attempt{env.get('GITHUB_RUN_ATTEMPT', '1')}",
    ]
    if use > 1:
        parts.append(f"use{use}")
    return _BAD_NAME_CHARS.sub("-", "-".join(parts))


# GitHub drops a job summary over 1 MiB
# (https://docs.github.com/en/actions/using-workflows/workflow-commands-for-github-actions#step-isolation-and-limits);
# the table and problem list are cut to stay under this, with a note saying so.
MAX_SUMMARY_BYTES = 900_000
# Past this the manifest is not hashed: the verifier refuses to read it, so it names nothing.
MAX_HASHED_BYTES = schema.MAX_FIXTURE_FILE_BYTES


def outputs(directory: Path, report: Verification | None) -> dict[str, str]:
    """Step outputs: verdict, passed, failed, valid, problems, manifest-sha256, evidence-dir."""
    preempt = _preempt_verified(directory)
    if preempt is not None:
        return _preempt_outputs(directory, preempt)
    results = report.results if report is not None else {}
    passed = sum(r["verdict"] == "pass" for r in results.values())
    return {
        "verdict": "pass" if report is not None and report.passed else "fail",
        "passed": str(passed),
        "failed": str(len(_names(report)) - passed),
        # A workflow gating on `failed` alone would miss an invalid artifact whose scenarios pass.
        "valid": "true" if report is not None and report.valid else "false",
        "problems": str(len(report.problems) if report is not None else 1),
        "manifest-sha256": manifest_sha256(directory),
        "evidence-dir": _text(_absolute(directory)),
    }


def manifest_sha256(directory: Path) -> str:
    """SHA-256 of the artifact's manifest, streamed; empty when there is no such regular file.

    Never follows a symlink or opens a FIFO, and never hashes past the verifier's size bound.
    """
    return _sha256(directory / schema.MANIFEST_FILE)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        for chunk in regular_file.chunks(path, bound=MAX_HASHED_BYTES):
            digest.update(chunk)
    except (OSError, ValueError):  # ValueError: a path os.open refuses (an embedded NUL)
        return ""
    return digest.hexdigest()


def summary(directory: Path, report: Verification | None) -> str:
    """Markdown for ``$GITHUB_STEP_SUMMARY``: a verdict line, a table, problems folded away.

    At most MAX_SUMMARY_BYTES of UTF-8, whatever the artifact holds.
    """
    preempt = _preempt_verified(directory)
    if preempt is not None:
        return _preempt_summary(preempt)
    out = outputs(directory, report)
    if report is None:
        return (
            "## dcp-invariant: no artifact\n\n"
            f"No evidence artifact at `{_cell(out['evidence-dir'])}`: the suite did not write one.\n"
        )
    if report.valid:
        headline = rules.verdict_line(
            "pass" if report.passed else "fail", int(out["passed"]), int(out["failed"])
        )
    else:
        headline = f"invalid artifact ({len(report.problems)} problems)"
    footer = [
        "",
        "Verify a downloaded artifact offline with `dcp-invariant verify DIR` first (it refuses "
        "a manifest naming files outside DIR); only if it passes, `sha256sum -c manifest.sha256` "
        "inside DIR.",
    ]
    lines = _Bounded(MAX_SUMMARY_BYTES - _size(footer) - 1024)
    lines.add(f"## dcp-invariant: {headline}", "")
    lines.add("| scenario | verdict | reason |", "|---|---|---|")
    for name in _names(report):
        result = report.results.get(name)
        if result is None:
            lines.add(f"| `{name}` | invalid | its observation does not have the schema's shape |")
            continue
        reasons = result["reasons"]
        reason = _cell(reasons[0]) if reasons else ""
        if len(reasons) > 1:
            reason += f" (+{len(reasons) - 1} more)"
        lines.add(f"| `{name}` | {result['verdict']} | {reason} |")
    if report.problems:
        lines.add(
            "",
            f"<details><summary>The artifact is invalid: {len(report.problems)} problems</summary>",
            "",
        )
        for problem in report.problems:
            lines.add(f"- {_cell(problem)}")
        lines.close("", "</details>")
    return "\n".join([*lines.done(), *footer]) + "\n"


class _Bounded:
    """Lines up to a byte budget; what does not fit is counted and named in a closing note."""

    def __init__(self, budget: int) -> None:
        self.lines: list[str] = []
        self.budget = budget
        self.left_out = 0
        self.closing: list[str] = []

    def add(self, *lines: str) -> None:
        for line in lines:
            size = len(line.encode("utf-8")) + 1
            if self.left_out or size > self.budget:
                self.left_out += 1
                continue
            self.budget -= size
            self.lines.append(line)

    def close(self, *lines: str) -> None:
        self.closing += lines  # always written, so an open <details> is always closed

    def done(self) -> list[str]:
        note = []
        if self.left_out:
            note = [
                "",
                f"… {self.left_out} more lines left out: a job summary is capped at "
                f"{MAX_SUMMARY_BYTES} bytes; `dcp-invariant verify DIR` prints everything.",
            ]
        return [*self.lines, *note, *self.closing]


# --- preempt's evidence --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Preempt:
    """``preempt.json`` as ``verify`` judges it: its lines (each failed point's reasons, then the
    verdict; or each problem) and, where it stands, the crash points that passed and failed."""

    valid: bool
    lines: list[str]
    passed: int = 0
    failed: int = 0


def _preempt_verified(directory: Path) -> _Preempt | None:
    """``directory``'s preempt record, verified; None where it holds none (a suite's artifact)."""
    from dcp_invariant import canonical
    from dcp_invariant.evidence.preempt import record

    try:
        if not (directory / record.PREEMPT_FILE).is_file():
            return None
    except (OSError, ValueError):  # a name too long, or one the OS cannot take
        return None
    valid, lines = record.verify(directory)
    if not valid:
        return _Preempt(False, lines)
    relaunches = canonical.loads((directory / record.PREEMPT_FILE).read_bytes())["relaunches"]
    failed = sum(bool(r["reasons"]) for r in relaunches)
    return _Preempt(True, lines, len(relaunches) - failed, failed)


def _preempt_outputs(directory: Path, verified: _Preempt) -> dict[str, str]:
    from dcp_invariant.evidence.preempt import record

    return {
        "verdict": "pass" if verified.valid and not verified.failed else "fail",
        "passed": str(verified.passed),
        "failed": str(verified.failed),
        "valid": "true" if verified.valid else "false",
        "problems": "0" if verified.valid else str(len(verified.lines)),
        # Its one file names this exact evidence, as a suite's manifest does.
        "manifest-sha256": _sha256(directory / record.PREEMPT_FILE),
        "evidence-dir": _text(_absolute(directory)),
    }


def _preempt_summary(verified: _Preempt) -> str:
    """The verdict line, then verify's lines: each failed crash point's reasons, or each problem
    (bounded as the suite's table is)."""
    *said, last = verified.lines if verified.valid else [*verified.lines, ""]
    headline = (
        f"preempt: {last}" if verified.valid else f"invalid preempt evidence ({len(said)} problems)"
    )
    footer = ["", "Verify downloaded evidence offline with `dcp-invariant verify DIR`."]
    lines = _Bounded(MAX_SUMMARY_BYTES - _size(footer) - 1024)
    lines.add(f"## dcp-invariant {headline}", "")
    for line in said:
        lines.add(f"- {_cell(line)}")
    return "\n".join([*lines.done(), *footer]) + "\n"


def _size(lines: list[str]) -> int:
    return sum(len(line.encode("utf-8")) + 1 for line in lines)


def report_for(directory: Path) -> Verification | None:
    try:
        is_dir = directory.is_dir()
    except (OSError, ValueError):  # a name too long, or one the OS cannot take
        is_dir = False
    return verify_artifact(directory) if is_dir else None


def render_outputs(values: Mapping[str, str]) -> str:
    """``$GITHUB_OUTPUT`` lines; a value with a line break uses the documented delimiter form
    (https://docs.github.com/en/actions/using-workflows/workflow-commands-for-github-actions#multiline-strings)."""
    out = []
    for key, value in values.items():
        value = _text(value)
        if "\n" in value or "\r" in value:
            delimiter = f"ghadelimiter_{secrets.token_hex(16)}"
            out.append(f"{key}<<{delimiter}\n{value}\n{delimiter}\n")
        else:
            out.append(f"{key}={value}\n")
    return "".join(out)


def write_outputs(path: Path, values: Mapping[str, str]) -> None:
    """Append every output with one write: all of them reach the file, or none does."""
    append(path, render_outputs(values))


def append_summary(path: Path, markdown: str) -> None:
    append(path, markdown)


def append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8", newline="\n") as f:
        f.write(_text(text))


def _text(text: str) -> str:
    """``text`` as valid UTF-8: bytes a file name could not decode become ``\\xNN``."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate that no undecodable byte stands for
        raw = text.encode("utf-8", "backslashreplace")
    return raw.decode("utf-8", "backslashreplace")


def _absolute(directory: Path) -> str:
    try:
        return str(directory.resolve())
    except (OSError, RuntimeError, ValueError):  # a symlink loop, a name too long
        return os.path.abspath(directory)


def _names(report: Verification | None) -> tuple[str, ...]:
    return (report.run_plan if report is not None else plan.REGISTERED).names


def _cell(text: str) -> str:
    text = " ".join(_text(text).split())
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 1] + "…"
    return html.escape(text, quote=False).replace("|", "\\|")
