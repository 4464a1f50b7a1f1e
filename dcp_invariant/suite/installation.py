"""Where this interpreter's standard library and installed packages lie, as ``sysconfig`` and
``site`` say: what the other release's ranks must not see (:mod:`.release_env`), and what the
fork server may import before any worker starts (:mod:`.fixture_imports`); and the runner's
import path as the fresh interpreters it starts find it (:mod:`.release_env`, the torchrun
agent's ranks)."""

from __future__ import annotations

import os
import site
import sys
import sysconfig


def package_directories() -> list[str]:
    """site-packages (pure and platform), the interpreter's others, and the user's own."""
    paths = sysconfig.get_paths()
    found = [paths["purelib"], paths["platlib"], *site.getsitepackages()]
    return [p for p in (*found, site.getusersitepackages()) if p]


def stdlib_directories() -> list[str]:
    paths = sysconfig.get_paths()
    return [paths["stdlib"], paths["platstdlib"]]


def import_path() -> list[str]:
    """``sys.path`` as a fresh interpreter working elsewhere finds it: an empty entry (python
    -c, standard input, a notebook) is the current directory, as multiprocessing gives its
    children (ORIGINAL_DIR in ``get_preparation_data``, multiprocessing/spawn.py); links
    resolved, directories only (a zip of the standard library is none), each once."""
    here = os.getcwd()
    found = (os.path.realpath(entry or here) for entry in sys.path if isinstance(entry, str))
    return list(dict.fromkeys(p for p in found if os.path.isdir(p)))
