"""The libraries a fixture's module opens with: found by reading its source, never by running
it, and imported once by the fork server, so that every worker it forks has them.

A run forks about 30 workers (the example at world sizes 1,2), and each builds the app, so
each imports the fixture's module. torch is imported once, in the fork server (``pool.PRELOAD``);
a fixture built on ``transformers`` would otherwise import it in each worker (about 1 s of CPU
each here). Only libraries are imported there, modules that live in site-packages, and only
those imported before any code of the user's would run: the user's own modules (the
fixture's, and any other outside site-packages) are read for their imports but run in the
workers alone, after the process group exists, as before. What the user's code registers with
a library at import (a custom op, a model class) is therefore registered once per worker,
never twice, and what it sets before an import (an environment variable the library reads) is
set before the library is imported, in the worker.

Each import here is what the statement in the user's module would do, in the order it would
run. The first that fails, or one still running when the run's timeout is up, ends the
imports: the worker's own import of the fixture runs it again and reports what it raises
(:func:`dcp_invariant.suite.fixture.load_fixture`), or times out with its group. What the
imports print goes to the server's log, ``libraries.log`` in its workspace.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import itertools
import json
import os
import signal
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from importlib.machinery import BuiltinImporter, ModuleSpec, PathFinder
from pathlib import Path
from types import FrameType
from typing import Literal

from dcp_invariant.suite import installation

# Where a module is imported from, as far as the fork server is concerned ("no code": a
# namespace package, which runs nothing; "unknown": not found without running anything).
Kind = Literal["library", "stdlib", "user", "no code", "unknown"]
_LIBRARY_DIRECTORIES = ("site-packages", "dist-packages")
# The fork server's environment carries the imports (read and dropped by .fork_server).
LIBRARIES_ENV = "DCP_INVARIANT_PRELOAD_LIBRARIES"
# Bounds on the walk (parsing alone takes about 0.7 s a MiB here; a fixture's own modules take
# milliseconds): a fixture's modules, not a monorepo, nor a library found outside site-packages
# and read as the user's; and on what the fork server's environment carries.
MAX_FILES = 64
MAX_FILE_BYTES = 256 << 10
MAX_TOTAL_BYTES = 1 << 20
MAX_MODULES = 512  # modules and packages looked at, namespace ones included
MAX_PARTS = 16  # of a dotted name
MAX_IMPORTS = 256  # statements' worth of library imports kept


@dataclass(frozen=True)
class LibraryImport:
    """``import MODULE`` (``names`` empty), or ``from MODULE import NAMES``."""

    module: str
    names: tuple[str, ...] = ()


def library_imports(spec: str, search_path: Sequence[str]) -> list[LibraryImport]:
    """The libraries the module of ``spec`` ("package.module:callable") imports before any code
    of the user's runs, in the order it imports them; ``[]`` where nothing can be read.

    The module is followed as the import system would run it: its parent packages first, then
    its statements in order, into each of the user's modules it imports, depth first. Reading
    stops at the first statement that is not an import (a docstring, ``if TYPE_CHECKING:`` and
    a ``try:`` of imports aside), and at a module that cannot be found or read: from there on,
    the user's code would run (it may set an environment variable a library reads as it is
    imported, or patch one), and what follows is left to the workers. Nothing is imported or
    run: modules are found with ``PathFinder`` on ``search_path`` and their source is parsed.
    """
    return _library_imports(spec, search_path, _Roots.here(spec, search_path))


def preload(spec: str, search_path: Sequence[str], timeout: float, log: str) -> Preload | None:
    """What the fork server is asked to import for the fixture ``spec``; None where nothing."""
    roots = _Roots.here(spec, search_path)
    imports = _library_imports(spec, search_path, roots)
    return Preload(tuple(imports), timeout, log, roots.libraries) if imports else None


def _library_imports(spec: str, search_path: Sequence[str], roots: _Roots) -> list[LibraryImport]:
    reader = _Reader([p for p in search_path if isinstance(p, str)], roots)
    reader.run(spec.partition(":")[0])
    return list(reader.found)


class _Reader:
    """One walk through the user's modules, in the order an import would run them."""

    def __init__(self, search_path: list[str], roots: _Roots) -> None:
        self.search_path = search_path
        self.roots = roots
        self.found: dict[LibraryImport, None] = {}
        self.ran: set[str] = set()
        self.files = self.bytes = 0
        self._specs: dict[str, ModuleSpec | None] = {}

    def find(self, name: str) -> ModuleSpec | None:
        if name not in self._specs:
            self._specs[name] = _find(name, self.search_path)
        return self._specs[name]

    def run(self, name: str) -> bool:
        """Import ``name`` and its parents; False where the user's code would run from here."""
        parts = _with_parents(name)
        if not parts:
            return False
        for part in parts:
            if part in self.ran:
                continue
            self.ran.add(part)
            if len(self.ran) > MAX_MODULES or not self._module(part):
                return False
        return True

    def _module(self, name: str) -> bool:
        kind = self._kind(name)
        if kind == "library":
            self.found.setdefault(LibraryImport(name), None)
            return True
        if kind in ("stdlib", "no code"):
            return True
        if kind == "unknown":
            return False
        where = self.find(name)
        if where is None or where.origin is None:
            return True  # a namespace package, here or in site-packages: it runs nothing
        data = self._read(where.origin)
        if data is None:
            return False
        tree = _parse(data)
        if tree is None:
            return False
        package = name if where.submodule_search_locations is not None else name.rpartition(".")[0]
        return self._statements(tree.body, package, first=True)

    def _statements(self, body: list[ast.stmt], package: str, first: bool = False) -> bool:
        for i, node in enumerate(body):
            if first and i == 0 and _is_docstring(node):
                continue
            if isinstance(node, ast.Import | ast.ImportFrom):
                if not self._import(node, package):
                    return False
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                if not self._statements(node.orelse, package):
                    return False
            elif isinstance(node, ast.Try):
                # Its handlers run only where an import failed, and the fork server stops at
                # the first that fails (import_libraries): they are never reached there.
                for part in (node.body, node.orelse, node.finalbody):
                    if not self._statements(part, package):
                        return False
            else:
                return False
        return True

    def _import(self, node: ast.Import | ast.ImportFrom, package: str) -> bool:
        for module, names in _absolute(node, package):
            kind = self._kind(module)
            if kind == "library":
                # ``from library import name`` imports the submodule ``name`` where the library
                # has no such attribute: the walk goes on only where that is a library's too.
                taken = tuple(itertools.takewhile(partial(self._a_libraries, module), names))
                if len(self.found) >= MAX_IMPORTS:
                    return False
                self.found.setdefault(LibraryImport(module, taken), None)
                if taken != names:
                    return False
            elif kind == "stdlib":
                continue
            elif kind == "unknown" or not self.run(module):
                return False
            else:
                # ``from package import name``: a submodule of the user's, where it is one.
                for name in names:
                    if self.find(f"{module}.{name}") and not self.run(f"{module}.{name}"):
                        return False
        return True

    def _a_libraries(self, module: str, name: str) -> bool:
        """``name`` of the library ``module`` is an attribute, or a submodule of a library."""
        submodule = f"{module}.{name}"
        return self.find(submodule) is None or self._kind(submodule) in ("library", "stdlib")

    def _kind(self, name: str) -> Kind:
        """ "library" where the module and each parent package with code live in site-packages,
        "stdlib" where its top-level package is the standard library's, "no code" for a
        namespace package that is neither, "unknown" where one cannot be found, else "user"."""
        kinds: list[Kind] = []
        for part in _with_parents(name):
            where = self.find(part)
            if where is None:
                return "unknown"
            kinds.append(self.roots.kind(part, where))
            if kinds[0] == "stdlib":
                return "stdlib"  # os.path, a name that is no file, among them
        if not kinds:
            return "unknown"
        if kinds[-1] == "no code":
            return "no code"
        # What runs is the code of the parents that have some, and the module's own.
        running = {k for k in kinds if k != "no code"}
        return running.pop() if running in ({"library"}, {"stdlib"}) else "user"

    def _read(self, origin: str) -> bytes | None:
        if not origin.endswith(".py") or self.files >= MAX_FILES:
            return None  # an extension module, bytecode alone, or past the bound
        try:
            with open(origin, "rb") as handle:
                data = handle.read(MAX_FILE_BYTES + 1)
        except OSError:
            return None
        if len(data) > MAX_FILE_BYTES or self.bytes + len(data) > MAX_TOTAL_BYTES:
            return None
        self.files += 1
        self.bytes += len(data)
        return data


@dataclass(frozen=True)
class Preload:
    """What the runner asks the fork server to import, in :data:`LIBRARIES_ENV`: the imports,
    the seconds they may take in all, and the file what they print goes to."""

    imports: tuple[LibraryImport, ...]
    timeout: float
    log: str
    libraries: tuple[str, ...]  # where libraries live: a submodule a from takes must too

    def encode(self) -> str:
        imports = [[each.module, list(each.names)] for each in self.imports]
        return json.dumps(
            {
                "imports": imports,
                "libraries": list(self.libraries),
                "log": self.log,
                "timeout": self.timeout,
            }
        )

    @classmethod
    def decode(cls, text: str) -> Preload:
        given = json.loads(text)
        imports = tuple(LibraryImport(module, tuple(names)) for module, names in given["imports"])
        libraries = tuple(str(p) for p in given["libraries"])
        return cls(imports, float(given["timeout"]), str(given["log"]), libraries)


class _TookTooLong(BaseException):
    """Raised by the alarm inside an import; a BaseException, so that the library's own
    ``except Exception`` does not take it for one of its errors."""


def import_libraries(
    imports: Sequence[LibraryImport], timeout: float, libraries: Sequence[str]
) -> list[str]:
    """Import each, in order, as its statement would, within ``timeout`` seconds in all (the
    main thread's alarm: the fork server imports in its main thread), stopping at the first
    that fails: in the worker, what follows it in the user's module may depend on how that
    failure is handled. A submodule a ``from`` takes is imported only where it lives under
    ``libraries``: a library may extend its ``__path__`` at import (``pkgutil.extend_path``)
    over a directory of the user's. One line for what was left, which the worker's own import
    runs again and reports (see the module's docstring).
    """
    if sys.platform == "win32":
        raise OSError("no fork server on Windows (pool.start_method), nor SIGALRM")
    left: list[str] = []
    alarm = {"armed": True}

    def took_too_long(signum: int, frame: FrameType | None) -> None:
        if alarm["armed"]:
            raise _TookTooLong

    previous = signal.signal(signal.SIGALRM, took_too_long)
    current = ""
    try:
        try:
            # Again every second past the bound: a library's bare ``except:`` may swallow one.
            signal.setitimer(signal.ITIMER_REAL, timeout, 1.0)
            for each in imports:
                current = each.module
                module = importlib.import_module(each.module)
                for name in each.names:
                    # ``from MODULE import NAME``: an attribute (a lazy module makes it on
                    # access), else a submodule.
                    if not hasattr(module, name):
                        current = f"{each.module}.{name}"
                        if not _libraries_own(current, libraries):
                            left.append(f"{current}: not found in site-packages")
                            return left
                        importlib.import_module(current)
        finally:
            alarm["armed"] = False
    except _TookTooLong:
        left.append(f"{current}: still importing after {timeout:g} s")
    except (Exception, SystemExit) as exc:  # left for the worker's own import to report
        left.append(f"{current}: {type(exc).__name__}: {exc}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return left


def _libraries_own(name: str, libraries: Sequence[str]) -> bool:
    """Whether the submodule ``name`` (its parent imported) would load from under ``libraries``:
    found as the import would find it, through the parent's ``__path__``, without running it."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return False
    return any(_under(p, root) for p in _spellings([spec.origin]) for root in libraries)


@contextlib.contextmanager
def output_to(log: str) -> Iterator[None]:
    """File descriptors 1 and 2 into ``log`` while the block runs: what the imports print goes
    to the server's log, as a worker's goes to its own, not to the user's terminal."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            # Into the log, before the descriptors go back; unless an import closed it.
            if not stream.closed:
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for each in (fd, *saved):
            os.close(each)


def _find(name: str, search_path: Sequence[str]) -> ModuleSpec | None:
    """Where ``name`` would be imported from, found without running any package's code; None
    where it cannot be found so (a namespace package inside a regular one is among those:
    ``PathFinder`` asks ``sys.modules`` for its parent)."""
    if name in sys.builtin_module_names:
        return BuiltinImporter.find_spec(name)
    path: list[str] = list(search_path)
    spec = None
    parts = name.split(".")
    for i in range(len(parts)):
        try:
            spec = PathFinder.find_spec(".".join(parts[: i + 1]), path)
        except (ImportError, OSError, ValueError, KeyError):
            return None
        if spec is None:
            return None
        if i < len(parts) - 1:
            if spec.submodule_search_locations is None:
                return None
            path = list(spec.submodule_search_locations)
    return spec


@dataclass(frozen=True)
class _Roots:
    libraries: tuple[str, ...]
    stdlib: tuple[str, ...]

    own: str  # the fixture's top-level package: the user's, wherever it is installed

    @classmethod
    def here(cls, spec: str, search_path: Sequence[str]) -> _Roots:
        """The roots for the fixture ``spec``, whose top-level package is the user's."""
        own = spec.partition(":")[0].partition(".")[0]
        libraries = set(installation.package_directories())
        # And any such directory on the path: a venv's --system-site-packages, Debian's
        # dist-packages, a PYTHONPATH pointing at another environment's.
        libraries |= {
            p for p in search_path if isinstance(p, str) and Path(p).name in _LIBRARY_DIRECTORIES
        }
        # And where this interpreter's own standard library is: a copied interpreter's need not
        # be where sysconfig says.
        stdlib = {
            *installation.stdlib_directories(),
            os.path.dirname(os.__file__),
            os.path.dirname(os.path.realpath(os.__file__)),  # a link to another's: that one's
        }
        return cls(_spellings(libraries), _spellings(stdlib), own)

    def kind(self, name: str, spec: ModuleSpec) -> Kind:
        """ "library" (site-packages), "stdlib", "user" (the fixture's own package, and anything
        else), or "no code" (a namespace package of the user's, or one split between the
        user's directories and site-packages: it runs nothing itself)."""
        top = name.partition(".")[0]
        if spec.origin in ("built-in", "frozen"):
            return "stdlib"
        if spec.origin is None:  # a namespace package: where its portions are
            places = {self._place(p) for p in spec.submodule_search_locations or []}
            only = places.pop() if len(places) == 1 and top != self.own else "no code"
            return "no code" if only == "user" else only
        if top == self.own:
            return "user"
        return self._place(spec.origin)

    def _place(self, path: str) -> Kind:
        where = _spellings([path])
        # site-packages may lie under the standard library's directory: libraries first.
        if any(_under(p, root) for p in where for root in self.libraries):
            return "library"
        if any(_under(p, root) for p in where for root in self.stdlib):
            return "stdlib"
        return "user"


def _spellings(paths: Iterable[str]) -> tuple[str, ...]:
    """Each path as given and with its links resolved: a directory of links to another's
    entries (a copied interpreter's standard library) matches either way."""
    return tuple(sorted({f(p) for p in paths for f in (os.path.abspath, os.path.realpath)}))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _parse(data: bytes) -> ast.Module | None:
    """The module's syntax tree; bytes, so that its coding cookie or BOM is honoured."""
    try:
        return ast.parse(data)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None  # the worker's import says what is wrong with it


def _is_docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _absolute(
    statement: ast.Import | ast.ImportFrom, package: str
) -> Iterator[tuple[str, tuple[str, ...]]]:
    """Each module a statement imports, absolute, with the names taken from it."""
    if isinstance(statement, ast.Import):
        for alias in statement.names:
            yield alias.name, ()
        return
    names = tuple(alias.name for alias in statement.names if alias.name != "*")
    if statement.level == 0:
        if statement.module:
            yield statement.module, names
        return
    parts = package.split(".") if package else []
    if statement.level - 1 > len(parts) or not parts:
        return  # beyond the top-level package: the worker's import raises it
    base = ".".join(parts[: len(parts) - (statement.level - 1)])
    if statement.module:
        yield f"{base}.{statement.module}", names
    else:
        for name in names:  # from . import a, b: submodules of the package
            yield f"{base}.{name}", ()


def _with_parents(name: str) -> list[str]:
    """``a``, ``a.b``, ``a.b.c`` for ``a.b.c``; nothing for what is not a dotted name."""
    parts = name.split(".")
    if len(parts) > MAX_PARTS or not all(part.isidentifier() for part in parts):
        return []
    return [".".join(parts[: i + 1]) for i in range(len(parts))]
