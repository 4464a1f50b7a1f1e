"""JUnit XML rendered from result records: one test case per scenario, no timings, no output."""

from __future__ import annotations

import re
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from dcp_invariant import plan

# XML 1.0 cannot carry these even escaped; reasons quote file names and errors that might.
_NOT_XML = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(text: str) -> str:
    return _NOT_XML.sub(lambda m: f"\\x{{{ord(m.group()):x}}}", text)


def render(results: dict[str, dict[str, Any]], *, run_plan: plan.Plan) -> bytes:
    failures = sum(results[n]["verdict"] == "fail" for n in run_plan.names)
    total = len(run_plan.names)
    counts = f'tests="{total}" failures="{failures}" errors="0" skipped="0"'
    lines = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<testsuites name="dcp-invariant" {counts}>',
        f'  <testsuite name="dcp-invariant" {counts}>',
    ]
    for name in run_plan.names:
        reasons = [_xml_text(r) for r in results[name]["reasons"]]
        head = f'    <testcase classname="dcp_invariant" name={quoteattr(name)}'
        if not reasons:
            lines.append(head + "/>")
            continue
        lines.append(head + ">")
        body = escape("\n".join(reasons))
        lines.append(f"      <failure message={quoteattr(reasons[0])}>{body}</failure>")
        lines.append("    </testcase>")
    lines += ["  </testsuite>", "</testsuites>", ""]
    return "\n".join(lines).encode("utf-8")
