"""Finding the libraries a fixture's module imports by reading it, and importing them as the
fork server does. Torch-free: pytest stands in for a library (it is in site-packages wherever
these tests run) and json for the standard library."""

from __future__ import annotations

import signal
import site
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dcp_invariant.suite import fixture_imports
from dcp_invariant.suite.fixture_imports import LibraryImport, library_imports

# Importing them is the fork server's, which Windows has not.
ON_POSIX = pytest.mark.skipif(sys.platform == "win32", reason="no fork server on Windows")


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_the_libraries_imported_as_the_module_loads_are_found_through_the_users_modules(
    tmp_path: Path,
) -> None:
    _write(
        tmp_path,
        {
            "app/__init__.py": "import pytest\n",
            "app/loop.py": """
                from __future__ import annotations
                import json
                from typing import TYPE_CHECKING
                from _pytest.monkeypatch import MonkeyPatch, derive_importpath
                from . import helpers
                from .models import net
                try:
                    import _pytest.python_api
                except ImportError:
                    pass
                if TYPE_CHECKING:
                    import _pytest.fixtures
                def build():
                    import _pytest.tmpdir
                class Holder:
                    import _pytest.capture
                def fixture(rank, world_size):
                    return None
            """,
            "app/helpers.py": "from _pytest import pathlib as p\n",
            "app/models/__init__.py": "",
            "app/models/net.py": "import pluggy\n",
        },
    )
    found = library_imports("app.loop:fixture", [str(tmp_path), *sys.path])
    assert found == [
        LibraryImport("pytest"),  # app/__init__.py runs first
        LibraryImport("_pytest.monkeypatch", ("MonkeyPatch", "derive_importpath")),
        LibraryImport("_pytest.python_api"),
        LibraryImport("_pytest.capture"),  # a class body runs as the module loads
        LibraryImport("_pytest", ("pathlib",)),
        LibraryImport("pluggy"),
    ]


def test_the_users_modules_are_read_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    _write(
        tmp_path,
        {
            "loud.py": f"""
                from pathlib import Path
                Path({str(marker)!r}).write_text("ran")
                import pytest
                raise SystemExit(3)
            """,
        },
    )
    assert library_imports("loud:fixture", [str(tmp_path), *sys.path]) == [LibraryImport("pytest")]
    assert not marker.exists()
    assert "loud" not in sys.modules


@pytest.mark.parametrize(
    ("files", "spec"),
    [
        ({}, "absent:fixture"),
        ({"broken.py": "import pytest\ndef (:\n"}, "broken:fixture"),
        ({"latin.py": "x = '\xe9'\n"}, "latin:fixture"),
        ({}, "not a name:fixture"),
        ({}, ":fixture"),
    ],
)
def test_what_cannot_be_read_gives_nothing_and_raises_nothing(
    tmp_path: Path, files: dict[str, str], spec: str
) -> None:
    _write(tmp_path, {})
    for name, text in files.items():
        (tmp_path / name).write_bytes(text.encode("latin-1"))
    assert library_imports(spec, [str(tmp_path), *sys.path]) == []


def test_reading_stops_after_max_files_of_the_users_own(tmp_path: Path) -> None:
    # A chain m0 -> m1 -> ...: the first module's library is found, the last one's is not.
    count = fixture_imports.MAX_FILES + 5
    files = {f"m{i}.py": f"import m{i + 1}\n" for i in range(count)}
    files["m0.py"] = "import pluggy\nimport m1\n"
    files[f"m{count}.py"] = "import pytest\n"
    _write(tmp_path, files)
    assert library_imports("m0:fixture", [str(tmp_path), *sys.path]) == [LibraryImport("pluggy")]


def test_the_imports_and_their_timeout_reach_the_server_whole() -> None:
    imports = [LibraryImport("a.b", ("c", "d")), LibraryImport("e")]
    assert fixture_imports.decode(fixture_imports.encode(imports, 12.5)) == (imports, 12.5)


@pytest.fixture
def importable(tmp_path: Path) -> Iterator[Path]:
    """A directory on sys.path for modules made here; what the test imported is forgotten."""
    before = set(sys.modules)
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in set(sys.modules) - before:
            del sys.modules[name]


@ON_POSIX
def test_each_import_runs_as_its_statement_would_and_a_failure_is_left_with_its_error(
    importable: Path,
) -> None:
    _write(
        importable,
        {
            "pre_lazy/__init__.py": """
                def __getattr__(name):
                    if name == "Made":
                        import pre_lazy.heavy
                        return pre_lazy.heavy.Made
                    raise AttributeError(name)
            """,
            "pre_lazy/heavy.py": "class Made: pass\n",
            "pre_lazy/sub.py": "",
            "pre_broken.py": "raise RuntimeError('no GPU driver')\n",
            "pre_exits.py": "raise SystemExit(4)\n",
            "pre_after.py": "",
        },
    )
    left = fixture_imports.import_libraries(
        [
            LibraryImport("pre_lazy", ("Made", "sub")),
            LibraryImport("pre_broken"),
            LibraryImport("pre_exits"),
            LibraryImport("pre_after"),
        ],
        60,
    )
    assert left == ["pre_broken: RuntimeError: no GPU driver", "pre_exits: SystemExit: 4"]
    assert {"pre_lazy.heavy", "pre_lazy.sub", "pre_after"} <= set(sys.modules)
    assert "pre_broken" not in sys.modules  # importlib forgets it: the worker's import runs again


@ON_POSIX
def test_imports_that_outlast_the_timeout_are_left_and_the_alarm_is_put_back(
    importable: Path,
) -> None:
    if sys.platform == "win32":
        return  # skipped: ON_POSIX
    _write(importable, {"pre_hangs.py": "import time\ntime.sleep(30)\n", "pre_next.py": ""})
    handler = signal.getsignal(signal.SIGALRM)
    started = time.monotonic()
    left = fixture_imports.import_libraries(
        [LibraryImport("pre_hangs"), LibraryImport("pre_next")], 0.5
    )
    assert time.monotonic() - started < 10
    assert left == ["pre_hangs: still importing after 0.5 s"]
    assert "pre_hangs" not in sys.modules and "pre_next" not in sys.modules
    assert signal.getsignal(signal.SIGALRM) == handler
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_the_fixtures_own_package_is_the_users_even_where_it_is_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # tmp_path/lib stands for site-packages, holding the user's installed package and a library.
    real = site.getsitepackages
    monkeypatch.setattr(site, "getsitepackages", lambda *a: [*real(*a), str(tmp_path / "lib")])
    _write(
        tmp_path / "lib",
        {
            "mine/__init__.py": "",
            "mine/train.py": "import mine.data\nimport theirs\n",
            "mine/data.py": "import pluggy\n",
            "theirs/__init__.py": "import pytest\n",
        },
    )
    found = library_imports("mine.train:fixture", [str(tmp_path / "lib"), *sys.path])
    assert found == [LibraryImport("theirs"), LibraryImport("pluggy")]
