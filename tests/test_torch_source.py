"""Which torch the project's own configuration gives uv: the CPU build, chosen by pyproject.toml.

uv resolves the project's ``runtime`` extra for Linux and for macOS, with PyTorch's CPU index
served on 127.0.0.1 (:mod:`local_torch_index`) and PyPI reached as usual. On Linux torch must
come from that index (``+cpu``); on macOS from PyPI, whose build there is the CPU one; nothing
else may come from PyTorch's index. Windows takes the Linux path (the same marker), but the local
index holds no Windows wheel to resolve against.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import local_torch_index
import pytest

pytestmark = pytest.mark.package

ROOT = Path(__file__).resolve().parent.parent
TORCH = "2.13.0"
RESOLVE_TIMEOUT = 600


def _resolve(uv: str, platform: str, env: dict[str, str], out: Path) -> dict[str, str]:
    """``name -> "version from index"`` for the runtime extra on ``platform``."""
    done = subprocess.run(
        [
            uv, "pip", "compile", str(ROOT / "pyproject.toml"), "--extra", "runtime",
            "--python-platform", platform, "--python-version", "3.11",
            "--no-header", "--emit-index-annotation", "--no-annotate", "-o", str(out),
        ],
        capture_output=True, text=True, timeout=RESOLVE_TIMEOUT, env=env, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found: dict[str, str] = {}
    name = ""
    for line in out.read_text(encoding="utf-8").splitlines():
        pin = re.fullmatch(r"([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if pin:
            name = pin[1].lower()
            found[name] = pin[2]
        elif line.strip().startswith("# from ") and name:
            found[name] += " from " + line.strip().removeprefix("# from ")
    return found


def test_uv_takes_torch_alone_from_pytorchs_cpu_index_except_on_macos(tmp_path: Path) -> None:
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not on PATH")
    if not local_torch_index.has_wheel(TORCH, "3.11"):
        pytest.skip(f"no CPU wheel of torch {TORCH} for Python 3.11 in pip's find-links")
    with local_torch_index.serve(tmp_path / "index") as served:
        # The project's configuration alone: none of this session's UV_ settings.
        env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
        env.update(served.environment(), UV_CACHE_DIR=str(tmp_path / "cache"))
        linux = _resolve(uv, "x86_64-manylinux_2_28", env, tmp_path / "linux.txt")
        # torch's macOS wheels are tagged macosx_14_0_arm64; uv assumes 13.0 unless told.
        env_macos = {**env, "MACOSX_DEPLOYMENT_TARGET": "14.0"}
        macos = _resolve(uv, "aarch64-apple-darwin", env_macos, tmp_path / "macos.txt")
    cpu_index = "https://download.pytorch.org/whl/cpu"
    assert linux["torch"] == f"{TORCH}+cpu from {cpu_index}"
    assert macos["torch"] == f"{TORCH} from https://pypi.org/simple"
    for resolved in (linux, macos):
        others = {n: v for n, v in resolved.items() if n != "torch" and cpu_index in v}
        assert others == {}, "only torch may come from PyTorch's index"
    assert linux["numpy"].endswith("from https://pypi.org/simple")
