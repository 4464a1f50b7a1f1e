"""The libraries a fixture's module imports as it loads: found by reading its source, never by
running it, and imported once by the fork server, so that every worker it forks has them.

A run forks about 30 workers (the example at world sizes 1,2), and each builds the app, so
each imports the fixture's module. torch is imported once, in the fork server (``pool.PRELOAD``);
a fixture built on ``transformers`` would otherwise import it in each worker (about 1 s of CPU
each here). Only libraries are imported there, modules that live in site-packages: the user's
own modules (the fixture's, and any other outside site-packages) are read for their imports but
run in the workers alone, after the process group exists, as before. What the user's code
registers with a library at import (a custom op, a model class) is therefore registered once
per worker, never twice.

Each import here is what the statement in the user's module would do. One that fails or takes
longer than the run's timeout is left: the worker's own import of the fixture runs it again and
reports what it raises (:func:`dcp_invariant.suite.fixture.load_fixture`), or times out with
its group.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import signal
import site
import sys
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib.machinery import ModuleSpec, PathFinder
from types import FrameType

# The fork server's environment carries the imports (read and dropped by .fork_server).
LIBRARIES_ENV = "DCP_INVARIANT_PRELOAD_LIBRARIES"
# Bounds on what is read (about 0.1 s of parsing at most): a fixture's own modules, not a
# monorepo, nor a library found outside site-packages and read as the user's.
MAX_FILES = 64
MAX_FILE_BYTES = 1 << 20
MAX_TOTAL_BYTES = 4 << 20


@dataclass(frozen=True)
class LibraryImport:
    """``import MODULE`` (``names`` empty), or ``from MODULE import NAMES``."""

    module: str
    names: tuple[str, ...] = ()


def library_imports(spec: str, search_path: Sequence[str]) -> list[LibraryImport]:
    """What the module of ``spec`` ("package.module:callable") and the user's modules it imports
    import from libraries as they load, in the order first seen; ``[]`` where nothing can be
    read. Nothing is imported or run: modules are found as the import system would find them on
    ``search_path`` (``PathFinder``) and their source is parsed.
    """
    module_name = spec.partition(":")[0]
    roots = _Roots.here(own=module_name.partition(".")[0])
    found: dict[LibraryImport, None] = {}
    queue = [module_name]
    seen: set[str] = set()
    files = total = 0
    while queue and files < MAX_FILES and total < MAX_TOTAL_BYTES:
        for name in _with_parents(queue.pop(0)):  # importing a.b runs a first
            if name in seen:
                continue
            seen.add(name)
            where = _find(name, search_path)
            if where is None or where.origin is None or roots.kind(name, where) != "user":
                continue
            source = _read(where.origin)
            if source is None:
                continue
            files += 1
            total += len(source)
            package = (
                name if where.submodule_search_locations is not None else name.rpartition(".")[0]
            )
            for statement in _executed_imports(source):
                for imported, names in _absolute(statement, package):
                    head = imported.partition(".")[0]
                    head_spec = _find(head, search_path)
                    if head_spec is not None and roots.kind(head, head_spec) == "library":
                        found.setdefault(LibraryImport(imported, names), None)
                    else:
                        # The user's, or the standard library's; a name may be a submodule.
                        queue += [imported, *(f"{imported}.{n}" for n in names)]
    return list(found)


def encode(imports: Sequence[LibraryImport], timeout: float) -> str:
    """The fork server's :data:`LIBRARIES_ENV`: the imports, and the seconds they may take."""
    return json.dumps(
        {"imports": [[each.module, list(each.names)] for each in imports], "timeout": timeout}
    )


def decode(text: str) -> tuple[list[LibraryImport], float]:
    given = json.loads(text)
    imports = [LibraryImport(module, tuple(names)) for module, names in given["imports"]]
    return imports, float(given["timeout"])


class _TookTooLong(BaseException):
    """Raised by the alarm inside an import; a BaseException, so that the library's own
    ``except Exception`` does not take it for one of its errors."""


def import_libraries(imports: Sequence[LibraryImport], timeout: float) -> list[str]:
    """Import each as its statement would, within ``timeout`` seconds in all (the main thread's
    alarm: the fork server imports in its main thread); one line for each import left, which
    the worker's own import runs again and reports (see the module's docstring).
    """
    if sys.platform == "win32":
        raise OSError("no fork server on Windows (pool.start_method), nor SIGALRM")
    left: list[str] = []

    def took_too_long(signum: int, frame: FrameType | None) -> None:
        raise _TookTooLong

    previous = signal.signal(signal.SIGALRM, took_too_long)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    try:
        for each in imports:
            try:
                module = importlib.import_module(each.module)
                for name in each.names:
                    # ``from MODULE import NAME``: an attribute (a lazy module makes it on
                    # access), else a submodule.
                    if not hasattr(module, name):
                        importlib.import_module(f"{each.module}.{name}")
            except _TookTooLong:
                left.append(f"{each.module}: still importing after {timeout:g} s")
                break
            except (Exception, SystemExit) as exc:  # left for the worker's import to report
                left.append(f"{each.module}: {type(exc).__name__}: {exc}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return left


def _find(name: str, search_path: Sequence[str]) -> ModuleSpec | None:
    """Where ``name`` would be imported from, found without running any package's code."""
    if name in sys.builtin_module_names:
        return None
    path: list[str] = list(search_path)
    spec = None
    parts = name.split(".")
    for i in range(len(parts)):
        try:
            spec = PathFinder.find_spec(".".join(parts[: i + 1]), path)
        except (ImportError, OSError, ValueError):
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
    def here(cls, own: str) -> _Roots:
        paths = sysconfig.get_paths()
        libraries = {paths["purelib"], paths["platlib"], *site.getsitepackages()}
        if site.ENABLE_USER_SITE:
            libraries.add(site.getusersitepackages())
        stdlib = {paths["stdlib"], paths["platstdlib"]}
        return cls(
            tuple(sorted(_real(p) for p in libraries)),
            tuple(sorted(_real(p) for p in stdlib)),
            own,
        )

    def kind(self, name: str, spec: ModuleSpec) -> str:
        """ "library" (site-packages), "stdlib", or "user": the fixture's own package, and
        anything else."""
        if name.partition(".")[0] == self.own:
            return "user"
        where = spec.origin
        if where is None or where in ("built-in", "frozen"):
            locations = list(spec.submodule_search_locations or [])
            if not locations:
                return "stdlib"
            where = locations[0]
        real = _real(where)
        # site-packages may lie under the standard library's directory: libraries first.
        if any(_under(real, root) for root in self.libraries):
            return "library"
        if any(_under(real, root) for root in self.stdlib):
            return "stdlib"
        return "user"


def _real(path: str) -> str:
    return os.path.realpath(path)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _read(origin: str) -> str | None:
    if not origin.endswith(".py"):
        return None  # an extension module, or bytecode alone: nothing to read
    try:
        with open(origin, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError:
        return None
    if len(data) > MAX_FILE_BYTES:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _executed_imports(source: str) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module loads: not those inside functions, nor
    under ``if TYPE_CHECKING:``."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return  # the worker's import says what is wrong with it
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            pending[:0] = node.orelse
        else:
            pending[:0] = [
                child
                for field in ("body", "orelse", "finalbody", "handlers", "cases")
                for child in _statements(getattr(node, field, []))
            ]


def _statements(children: object) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for child in children if isinstance(children, list) else []:
        if isinstance(child, ast.stmt):
            out.append(child)
        elif isinstance(child, ast.ExceptHandler | ast.match_case):
            out.extend(child.body)
    return out


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
    if not all(part.isidentifier() for part in parts):
        return []
    return [".".join(parts[: i + 1]) for i in range(len(parts))]
