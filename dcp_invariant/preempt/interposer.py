"""The interposer library (interposer.c), built once per source and machine with the system's
C compiler into the cache, then preloaded into every process of an instrumented launch.

A library shipped prebuilt would need a wheel per platform; every Linux that runs torch jobs
with its compilers (triton and torch.compile need one) builds this file in about a second.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

from dcp_invariant import other_release
from dcp_invariant.errors import PreemptInputError

BUILD_TIMEOUT = 120.0


def library(cache: Path | None = None) -> Path:
    """The built library, made now if this source has not been built on this machine."""
    if sys.platform != "linux":
        raise PreemptInputError(
            f"preempt runs on Linux only (this is {sys.platform}): it hears a job's file "
            "operations through LD_PRELOAD; run it in a Linux CI job or container"
        )
    source = resources.files("dcp_invariant.preempt").joinpath("interposer.c").read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:16]
    root = cache or Path(other_release.cache_dir(None, os.environ, sys.platform, Path.home()))
    built = root / "preempt" / f"interposer-{digest}.so"
    if built.is_file():
        return built
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise PreemptInputError(
            "preempt builds a small C library to hear the job's file writes and finds no C "
            "compiler: install one (apt-get install gcc) or set CC"
        )
    built.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=built.parent) as scratch:
        src, out = Path(scratch, "interposer.c"), Path(scratch, "interposer.so")
        src.write_bytes(source)
        done = subprocess.run(
            [compiler, "-O2", "-shared", "-fPIC", "-o", str(out), str(src), "-ldl", "-lpthread"],
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT,
            check=False,
        )
        if done.returncode != 0:
            first = (done.stderr.strip().splitlines() or ["no output"])[0]
            raise PreemptInputError(
                f"preempt could not build its interposer with {compiler} ({first}): install "
                "gcc, or set CC to a working C compiler"
            )
        os.replace(out, built)  # whole or not at all: another run may build it at once
    return built
