"""Finding the libraries a fixture's module imports by reading it, and importing them as the
fork server does. Torch-free: pytest stands in for a library (it is in site-packages wherever
these tests run) and json for the standard library."""

from __future__ import annotations

import json
import os
import signal
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


def test_the_libraries_are_found_in_the_order_the_imports_run_until_the_users_code_runs(
    tmp_path: Path,
) -> None:
    _write(
        tmp_path,
        {
            "app/__init__.py": "import pytest\n",
            "app/loop.py": """
                \"\"\"The loop.\"\"\"
                from __future__ import annotations
                import json
                from typing import TYPE_CHECKING
                from . import helpers
                from _pytest.monkeypatch import MonkeyPatch, derive_importpath
                from .models import net
                try:
                    import _pytest.python_api
                except ImportError:
                    import iniconfig
                if TYPE_CHECKING:
                    import _pytest.fixtures
                import _pytest.capture
                SEED = 1
                import _pytest.tmpdir
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
        LibraryImport("_pytest", ("pathlib",)),  # in helpers, imported before the next line
        LibraryImport("_pytest.monkeypatch", ("MonkeyPatch", "derive_importpath")),
        LibraryImport("pluggy"),
        LibraryImport("_pytest.python_api"),  # not iniconfig: its handler runs on a failure
        LibraryImport("_pytest.capture"),  # and not _pytest.tmpdir: SEED = 1 runs before it
    ]


@pytest.mark.parametrize(
    "files",
    [
        # The environment a library reads as it is imported, set before the import.
        {"loop.py": "import os\nos.environ['HF_HUB_OFFLINE'] = '1'\nimport pytest\n"},
        # A module of the user's that runs code before the loop's next import.
        {"loop.py": "import helper\nimport pytest\n", "helper.py": "import pluggy\nX = 1\n"},
        # A script's block, and anything else that is not an import.
        {"loop.py": "if __name__ == '__main__':\n    import pytest\nimport pytest\n"},
    ],
    ids=["environment", "helper-runs-code", "main-block"],
)
def test_nothing_is_preloaded_after_the_users_code_would_run(
    tmp_path: Path, files: dict[str, str]
) -> None:
    _write(tmp_path, files)
    found = library_imports("loop:fixture", [str(tmp_path), *sys.path])
    assert LibraryImport("pytest") not in found, found
    assert found == ([LibraryImport("pluggy")] if "helper.py" in files else [])


def test_the_standard_library_reached_through_links_is_still_the_standard_library(
    tmp_path: Path,
) -> None:
    # A copied interpreter whose standard library is a directory of links to another's entries
    # (a toolcache): were json read as the user's, its first line of code would end the walk.
    linked = tmp_path / "python" / "lib"
    linked.mkdir(parents=True)
    (linked / "json").symlink_to(Path(json.__file__).parent)
    _write(tmp_path, {"loop.py": "import json\nimport os.path\nimport pytest\n"})
    search = [str(linked), str(tmp_path), *sys.path]
    assert library_imports("loop:fixture", search) == [LibraryImport("pytest")]


def test_a_module_of_the_users_named_as_one_of_the_standard_librarys_is_the_users(
    tmp_path: Path,
) -> None:
    _write(tmp_path, {"code.py": "X = 1\n", "loop.py": "import code\nimport pytest\n"})
    assert library_imports("loop:fixture", [str(tmp_path), *sys.path]) == []


@pytest.fixture
def site_packages(tmp_path: Path) -> Path:
    """Another environment's site-packages, as a --system-site-packages venv has on its path."""
    return tmp_path / "other" / "site-packages"


def test_a_namespace_package_split_with_site_packages_is_read_as_the_users(
    tmp_path: Path, site_packages: Path
) -> None:
    # site-packages holds one portion of acme; the user's has train.
    _write(site_packages, {"acme/vendored.py": "import pytest\n"})
    _write(
        tmp_path,
        {
            "src/acme/train.py": "import pluggy\nimport acme.vendored\n",
            "loop.py": "import acme.train\n",
        },
    )
    search = [str(site_packages), str(tmp_path / "src"), str(tmp_path), *sys.path]
    assert library_imports("loop:fixture", search) == [
        LibraryImport("pluggy"),
        LibraryImport("acme.vendored"),
    ]


def test_the_users_modules_are_read_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    _write(
        tmp_path,
        {
            "loud.py": f"""
                import pytest
                from pathlib import Path
                Path({str(marker)!r}).write_text("ran")
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
        ({"deep.py": "x = a" + " + a" * 200_000 + "\n"}, "deep:fixture"),  # RecursionError
        ({"nots.py": "x = " + "not " * 100_000 + "x\n"}, "nots:fixture"),  # MemoryError
        # A namespace package inside a regular one: PathFinder asks sys.modules for its parent.
        (
            {"app/__init__.py": "", "app/models/net.py": "", "nsloop.py": "import app.models.net"},
            "nsloop:fixture",
        ),
    ],
    ids=["absent", "syntax", "latin-1", "not-a-name", "no-module", "deep", "nots", "namespace"],
)
def test_what_cannot_be_read_gives_nothing_and_raises_nothing(
    tmp_path: Path, files: dict[str, str], spec: str
) -> None:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(text.encode("latin-1"))
    assert library_imports(spec, [str(tmp_path), *sys.path]) == []


def test_a_module_in_another_encoding_is_read_as_its_coding_line_says(tmp_path: Path) -> None:
    text = "# -*- coding: latin-1 -*-\n'caf\xe9'\nimport pytest\n"
    (tmp_path / "latin.py").write_bytes(text.encode("latin-1"))
    assert library_imports("latin:fixture", [str(tmp_path), *sys.path]) == [LibraryImport("pytest")]


def test_reading_stops_after_max_files_of_the_users_own(tmp_path: Path) -> None:
    # A chain m0 -> m1 -> ...: the first module's library is found, the last one's is not.
    count = fixture_imports.MAX_FILES + 5
    files = {f"m{i}.py": f"import m{i + 1}\n" for i in range(count)}
    files["m0.py"] = "import pluggy\nimport m1\n"  # the chain's end is never read
    files[f"m{count}.py"] = "import pytest\n"
    _write(tmp_path, files)
    assert library_imports("m0:fixture", [str(tmp_path), *sys.path]) == [LibraryImport("pluggy")]


def test_what_the_server_is_asked_to_import_reaches_it_whole() -> None:
    given = fixture_imports.Preload(
        (LibraryImport("a.b", ("c", "d")), LibraryImport("e")),
        12.5,
        "/w/server/libraries.log",
        ("/venv/lib/python3.11/site-packages",),
    )
    assert fixture_imports.Preload.decode(given.encode()) == given


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
@pytest.mark.parametrize(
    ("failing", "error"),
    [("pre_broken", "RuntimeError: no GPU driver"), ("pre_exits", "SystemExit: 4")],
)
def test_each_import_runs_as_its_statement_would_up_to_the_first_that_fails(
    importable: Path, failing: str, error: str
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
    imports = [
        LibraryImport("pre_lazy", ("Made", "sub")),
        LibraryImport(failing),
        LibraryImport("pre_after"),
    ]
    assert fixture_imports.import_libraries(imports, 60, [str(importable)]) == [
        f"{failing}: {error}"
    ]
    assert {"pre_lazy.heavy", "pre_lazy.sub"} <= set(sys.modules)
    # importlib forgets it, so the worker's import runs it again; what follows is the worker's.
    assert failing not in sys.modules and "pre_after" not in sys.modules


@ON_POSIX
def test_imports_that_outlast_the_timeout_are_left_and_the_alarm_is_put_back(
    importable: Path,
) -> None:
    if sys.platform == "win32":
        return  # skipped: ON_POSIX
    _write(
        importable,
        {
            "pre_hangs.py": "import time\ntime.sleep(30)\n",
            # A bare except takes the first alarm; the next, a second later, ends it.
            "pre_swallows.py": "import time\ntry:\n    time.sleep(30)\nexcept:\n    pass\ntime.sleep(30)\n",
            "pre_next.py": "",
        },
    )
    handler = signal.getsignal(signal.SIGALRM)
    for hangs in ("pre_hangs", "pre_swallows"):
        started = time.monotonic()
        left = fixture_imports.import_libraries(
            [LibraryImport(hangs), LibraryImport("pre_next")], 0.5, [str(importable)]
        )
        assert time.monotonic() - started < 10
        assert left == [f"{hangs}: still importing after 0.5 s"]
        assert hangs not in sys.modules and "pre_next" not in sys.modules
    assert signal.getsignal(signal.SIGALRM) == handler
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_the_fixtures_own_package_is_the_users_even_where_it_is_installed(
    site_packages: Path,
) -> None:
    # site-packages holds the user's installed package and a library.
    _write(
        site_packages,
        {
            "mine/__init__.py": "",
            "mine/train.py": "import mine.data\nimport theirs\n",
            "mine/data.py": "import pluggy\n",
            "theirs/__init__.py": "import pytest\n",
        },
    )
    found = library_imports("mine.train:fixture", [str(site_packages), *sys.path])
    assert found == [LibraryImport("pluggy"), LibraryImport("theirs")]


@ON_POSIX
def test_what_the_imports_print_goes_to_the_log_not_the_terminal(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "libraries.log"
    print("before", flush=True)
    with fixture_imports.output_to(str(log)):
        os.write(1, b"a warning at import\n")
        os.write(2, b"from C\n")
    print("after", flush=True)
    assert log.read_text(encoding="utf-8") == "a warning at import\nfrom C\n"
    out, err = capfd.readouterr()
    assert (out, err) == ("before\nafter\n", "")


@ON_POSIX
def test_a_submodule_a_library_would_take_from_the_users_directory_is_not_imported(
    importable: Path,
) -> None:
    # A library that extends its __path__ over every directory of its name on sys.path, one of
    # them the user's: `from pre_ext import mine` would run the user's module.
    marker = importable / "ran"
    libraries = importable / "env" / "site-packages"
    _write(
        importable,
        {
            "env/site-packages/pre_ext/__init__.py": (
                "from pkgutil import extend_path\n__path__ = extend_path(__path__, __name__)\n"
            ),
            "pre_ext/mine.py": f"from pathlib import Path\nPath({str(marker)!r}).write_text('')\n",
        },
    )
    sys.path.insert(0, str(libraries))
    try:
        left = fixture_imports.import_libraries(
            [LibraryImport("pre_ext", ("mine",))], 60, [str(libraries)]
        )
    finally:
        sys.path.remove(str(libraries))
    assert left == ["pre_ext.mine: not found in site-packages"]
    assert not marker.exists()


@ON_POSIX
def test_an_alarm_however_soon_never_escapes(importable: Path) -> None:
    _write(importable, {f"pre_quick{i}.py": "" for i in range(3)})
    for _ in range(20):
        imports = [LibraryImport(f"pre_quick{i}") for i in range(3)]
        left = fixture_imports.import_libraries(imports, 1e-6, [str(importable)])
        assert left in ([], [f"{left[0].partition(':')[0]}: still importing after 1e-06 s"])
        for i in range(3):
            sys.modules.pop(f"pre_quick{i}", None)


@ON_POSIX
def test_an_import_that_closes_stdout_leaves_the_descriptors_restored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "stdout", open(tmp_path / "out", "w", encoding="utf-8"))  # noqa: SIM115
    with fixture_imports.output_to(str(tmp_path / "libraries.log")):
        sys.stdout.close()  # a flush would now raise ValueError
    os.write(1, b"after\n")
    assert capfd.readouterr().out == "after\n"
