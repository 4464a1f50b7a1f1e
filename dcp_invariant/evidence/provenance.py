"""provenance.json: which code and which runtime produced an artifact. Unsigned, and says so."""

from __future__ import annotations

import platform
import re
from typing import Any

from dcp_invariant import __version__
from dcp_invariant.evidence import checks, schema

_HEX40 = re.compile(r"[0-9a-f]{40}")
valid_revision = _HEX40.fullmatch

SHAPE = checks.record(
    authenticated=checks.one_of(False),
    cpython=checks.string,
    numpy=checks.optional(checks.string),
    schema_version=checks.one_of(schema.SCHEMA_VERSION),
    source_revision=checks.pattern(_HEX40, "a 40-hex source revision"),
    tool=checks.string,
    torch_distribution=checks.string,
    torch_runtime=checks.string,
)


def build(
    *, source_revision: str, torch_distribution: str, torch_runtime: str, numpy: str | None
) -> dict[str, Any]:
    return {
        # Nothing signs the artifact: the manifest detects damage, not forgery.
        "authenticated": False,
        "cpython": platform.python_version(),
        "numpy": numpy,
        "schema_version": schema.SCHEMA_VERSION,
        "source_revision": source_revision,
        "tool": f"dcp-invariant {__version__}",
        "torch_distribution": torch_distribution,
        "torch_runtime": torch_runtime,
    }
