"""Shared by the fuzz tests and the hostile-input corpus: a watched verifier.

:func:`watched_verify` runs the real verifier on a directory while a Python audit hook
(https://docs.python.org/3/library/sys.html#sys.addaudithook) records every file it opens and
every directory it lists, and fails if any lies outside the artifact. It also renders the
GitHub summary and outputs of the same artifact, which must not raise either and must stay
under GitHub's size limit.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

from mutation_walk import DATA

from dcp_invariant import canonical, github, plan
from dcp_invariant.evidence import artifact, manifest, rules, schema
from dcp_invariant.evidence.verify import Verification, verify_artifact

CORPUS = DATA / "hostile"
_touched: list[str] | None = None


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _touched is not None and event in ("open", "os.scandir", "os.listdir") and args:
        path = args[0]
        if isinstance(path, (str, bytes, os.PathLike)):
            _touched.append(os.fsdecode(os.fspath(path)))


sys.addaudithook(_audit)  # inert until watched_verify sets _touched


def watched_verify(directory: Path) -> Verification:
    """``verify_artifact(directory)``, failing if it opened or listed anything outside it."""
    global _touched
    root = os.path.abspath(directory)
    _touched = []
    try:
        report = verify_artifact(directory)
    finally:
        touched, _touched = _touched, None
    outside = [p for p in touched if os.path.commonpath([root, os.path.abspath(p)]) != root]
    assert outside == [], f"the verifier reached outside the artifact: {outside}"
    markdown = github.summary(directory, report)
    assert len(markdown.encode("utf-8")) <= github.MAX_SUMMARY_BYTES
    outputs = github.render_outputs(github.outputs(directory, report))
    assert "valid=false" in outputs or report.valid
    return report


def reseal(directory: Path) -> None:
    """Recompute manifest.sha256 over the plan's files as they now are, as a forger would."""
    covered = {
        rel: (directory / rel).read_bytes()
        for rel in schema.ARTIFACT_FILES
        if rel != schema.MANIFEST_FILE and (directory / rel).is_file()
    }
    (directory / schema.MANIFEST_FILE).write_bytes(manifest.render(covered))


def corpus_cases() -> list[Path]:
    return sorted(CORPUS.glob("*.json"))


def apply_case(case: dict[str, Any], directory: Path) -> None:
    """Apply one corpus case (the keys are described in tests/data/hostile/README.md)."""
    if "file" in case:
        path = directory / case["file"]
        data = path.read_bytes() if path.is_file() else b""
        if "base64" in case:
            data = base64.b64decode(case["base64"])
        elif "text" in case:
            data = case["text"].encode("utf-8")
        elif "repeat" in case:
            r = case["repeat"]
            data = (r["open"] * r["times"] + r.get("inner", "") + r["close"] * r["times"]).encode()
            data += b"\n"
        for old, new in case.get("replace", []):
            assert old.encode() in data, f"{case['description']}: {old!r} not in {case['file']}"
            data = data.replace(old.encode(), new.encode(), 1)
        for old, new in case.get("replace_base64", []):
            data = data.replace(base64.b64decode(old), base64.b64decode(new), 1)
        data = base64.b64decode(case.get("prepend_base64", "")) + data
        path.write_bytes(data)
    if "add" in case:
        with open(os.path.join(os.fsencode(directory), base64.b64decode(case["add"])), "wb"):
            pass
    if "mkdir" in case:
        (directory / case["mkdir"]).mkdir()
    if "remove" in case:
        (directory / case["remove"]).unlink()
    if case.get("rederive"):
        rederive(directory)
    if case.get("reseal") or case.get("rederive"):
        reseal(directory)


def rederive(directory: Path) -> None:
    """Rewrite results, summary and JUnit from the observations, as a careful forger would."""
    run_plan = plan.REGISTERED
    observations = {
        name: canonical.loads((directory / schema.observation_file(name)).read_bytes())
        for name in run_plan.names
    }
    for rel, data in artifact.derived(
        rules.results(observations, run_plan=run_plan), run_plan=run_plan
    ).items():
        (directory / rel).write_bytes(data)


def load_case(path: Path) -> dict[str, Any]:
    case: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return case
