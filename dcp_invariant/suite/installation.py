"""Where this interpreter's standard library and installed packages lie, as ``sysconfig`` and
``site`` say: what the other release's ranks must not see (:mod:`.release_env`), and what the
fork server may import before any worker starts (:mod:`.fixture_imports`)."""

from __future__ import annotations

import site
import sysconfig


def package_directories() -> list[str]:
    """site-packages (pure and platform), the interpreter's others, and the user's own."""
    paths = sysconfig.get_paths()
    found = [paths["purelib"], paths["platlib"], *site.getsitepackages()]
    return [p for p in (*found, site.getusersitepackages()) if p]


def stdlib_directories() -> list[str]:
    paths = sysconfig.get_paths()
    return [paths["stdlib"], paths["platstdlib"]]
