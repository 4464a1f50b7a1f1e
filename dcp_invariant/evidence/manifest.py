"""``manifest.sha256`` in sha256sum's text format, so ``sha256sum -c manifest.sha256`` checks it.

The manifest is unsigned: it detects accidental damage and edits that forget to update it,
not a forger who rewrites it too. It is only ever compared with the files found in the
artifact: no path it names is opened.
"""

from __future__ import annotations

import hashlib
import re

from dcp_invariant.errors import Error

_LINE = re.compile(r"([0-9a-f]{64})  ([A-Za-z0-9_./-]+)")


class ManifestError(Error, ValueError):
    pass


def render(files: dict[str, bytes]) -> bytes:
    return b"".join(
        f"{hashlib.sha256(data).hexdigest()}  {path}\n".encode()
        for path, data in sorted(files.items())
    )


def parse(raw: bytes) -> dict[str, str]:
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError as exc:
        raise ManifestError("manifest.sha256: not ASCII") from exc
    if not text.endswith("\n"):
        raise ManifestError("manifest.sha256: must end with a newline")
    entries: dict[str, str] = {}
    for number, line in enumerate(text[:-1].split("\n"), start=1):
        match = _LINE.fullmatch(line)
        if match is None:
            raise ManifestError(f"manifest.sha256 line {number}: expected '<64 hex>  <path>'")
        digest, path = match.groups()
        parts = path.split("/")
        if path.startswith("/") or any(part in ("", ".", "..") for part in parts):
            # sha256sum -c would open such a path wherever it leads (/dev/zero never ends);
            # this tool never opens a path the manifest names, and refuses the manifest.
            raise ManifestError(
                f"manifest.sha256 line {number}: {path} is not a relative path inside the artifact"
            )
        if path in entries:
            raise ManifestError(f"manifest.sha256 line {number}: {path} listed twice")
        entries[path] = digest
    if list(entries) != sorted(entries):
        raise ManifestError("manifest.sha256: entries must be sorted by path")
    return entries
