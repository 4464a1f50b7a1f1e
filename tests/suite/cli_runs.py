"""Running the CLI as a user does, for the live tests: the installed console script (or
``python -m dcp_invariant`` where there is none) in a subprocess with a timeout."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REVISION = "0123456789abcdef0123456789abcdef01234567"
# A whole registered suite takes about a minute here; a slow CI machine, several.
CLI_TIMEOUT = 900


def run_cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it: a fixture is found from ``cwd``."""
    script = shutil.which("dcp-invariant", path=str(Path(sys.executable).parent))
    command = [script] if script else [sys.executable, "-m", "dcp_invariant"]
    return subprocess.run(
        [*command, *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        cwd=cwd,
        env=env,
        check=False,
    )
