"""The GitHub Actions job summary and step outputs for an evidence artifact.

Everything the composite action shows is derived here, by the verifier, from the artifact on
disk: the shell steps only call ``dcp-invariant github-report``. Imports no torch.
"""

from __future__ import annotations

import hashlib
import html
import platform
import re
import sys
from collections.abc import Mapping
from pathlib import Path

from dcp_invariant import plan
from dcp_invariant.evidence import schema
from dcp_invariant.evidence.verify import Report, verify_artifact

MAX_REASON_CHARS = 300
# actions/upload-artifact refuses these in a name.
_BAD_NAME_CHARS = re.compile(r'["<>|*?:\\/\r\n]')


class ArtifactNameError(ValueError):
    pass


def artifact_name(given: str, torch_version: str, env: Mapping[str, str]) -> str:
    """``given``, or a default unique per job of a matrix over OS, Python and torch and per attempt.

    Upload fails on a name already used in the workflow run, so a matrix cannot share one.
    """
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
        f"py{python}",
        f"torch{torch_version or 'default'}",
        f"attempt{env.get('GITHUB_RUN_ATTEMPT', '1')}",
    ]
    return _BAD_NAME_CHARS.sub("-", "-".join(parts))


def outputs(directory: Path, report: Report | None) -> dict[str, str]:
    """Step outputs the action declares: verdict, passed, failed, manifest-sha256, evidence-dir."""
    results = report.results if report is not None else {}
    passed = sum(r["verdict"] == "pass" for r in results.values())
    manifest = directory / schema.MANIFEST_FILE
    return {
        "verdict": "pass" if report is not None and report.passed else "fail",
        "passed": str(passed),
        "failed": str(len(_names(report)) - passed),
        "manifest-sha256": hashlib.sha256(manifest.read_bytes()).hexdigest()
        if manifest.is_file()
        else "",
        "evidence-dir": str(directory.resolve()),
    }


def summary(directory: Path, report: Report | None) -> str:
    """Markdown for ``$GITHUB_STEP_SUMMARY``: a verdict line, a table, problems folded away."""
    out = outputs(directory, report)
    lines = [
        f"## dcp-invariant: {out['verdict']} ({out['passed']} passed, {out['failed']} failed)",
        "",
    ]
    if report is None:
        lines += [
            f"No evidence artifact at `{_cell(str(directory))}`: the suite did not write one."
        ]
        return "\n".join(lines) + "\n"
    lines += ["| scenario | verdict | reason |", "|---|---|---|"]
    for name in _names(report):
        result = report.results.get(name)
        if result is None:
            lines.append(
                f"| `{name}` | invalid | its observation does not have the schema's shape |"
            )
            continue
        reasons = result["reasons"]
        reason = _cell(reasons[0]) if reasons else ""
        if len(reasons) > 1:
            reason += f" (+{len(reasons) - 1} more)"
        lines.append(f"| `{name}` | {result['verdict']} | {reason} |")
    if report.problems:
        lines += [
            "",
            f"<details><summary>The artifact is invalid: {len(report.problems)} problems</summary>",
            "",
            *[f"- {_cell(p)}" for p in report.problems],
            "",
            "</details>",
        ]
    lines += [
        "",
        "Verify a downloaded artifact offline: `dcp-invariant verify DIR` and, inside it, "
        "`sha256sum -c manifest.sha256`.",
    ]
    return "\n".join(lines) + "\n"


def report_for(directory: Path) -> Report | None:
    return verify_artifact(directory) if directory.is_dir() else None


def write_outputs(path: Path, values: dict[str, str]) -> None:
    with open(path, "a", encoding="utf-8", newline="\n") as f:
        for key, value in values.items():
            if "\n" in value or "\r" in value:
                raise ValueError(f"output {key} spans lines")
            f.write(f"{key}={value}\n")


def append_summary(path: Path, markdown: str) -> None:
    with open(path, "a", encoding="utf-8", newline="\n") as f:
        f.write(markdown)


def _names(report: Report | None) -> tuple[str, ...]:
    return (report.run_plan if report is not None else plan.REGISTERED).names


def _cell(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > MAX_REASON_CHARS:
        text = text[: MAX_REASON_CHARS - 1] + "…"
    return html.escape(text, quote=False).replace("|", "\\|")
