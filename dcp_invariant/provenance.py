"""provenance.json: which code and which runtime produced an artifact. Unsigned, and says so."""

from __future__ import annotations

import platform
import re
from typing import Any

from dcp_invariant import __version__, observation, schema

_HEX40 = re.compile(r"[0-9a-f]{40}")
valid_revision = _HEX40.fullmatch

SHAPE = observation.record(
    authenticated=observation.one_of(False),
    cpython=observation.string,
    numpy=observation.optional(observation.string),
    schema_version=observation.one_of(schema.SCHEMA_VERSION),
    source_revision=observation.pattern(_HEX40, "a 40-hex source revision"),
    tool=observation.string,
    torch_distribution=observation.string,
    torch_runtime=observation.string,
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
