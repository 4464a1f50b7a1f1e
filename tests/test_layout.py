"""The folders are the architecture: the import graph between them is checked, not hoped for."""

from __future__ import annotations

import ast
from pathlib import Path

import dcp_invariant

PACKAGE = Path(dcp_invariant.__file__).parent


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Each package module and the package modules it imports (any depth, lazy ones included)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets.add(node.module)
                targets |= {f"{node.module}.{a.name}" for a in node.names}
        graph[name] = {t for t in targets if t.split(".")[0] == "dcp_invariant"}
    modules = set(graph)
    # ``from dcp_invariant.evidence import rules`` names a module; ``import X`` of a name does not.
    return {name: {t for t in targets if t in modules} for name, targets in graph.items()}


def test_evidence_and_commit_never_import_the_suite() -> None:
    for name, targets in _imports().items():
        if name.startswith(("dcp_invariant.evidence", "dcp_invariant.commit")):
            assert not [t for t in targets if t.startswith("dcp_invariant.suite")], name


def test_the_evidence_side_does_not_need_the_commit_protocol() -> None:
    for name, targets in _imports().items():
        if name.startswith("dcp_invariant.evidence"):
            assert not [t for t in targets if t.startswith("dcp_invariant.commit")], name


def test_inspect_needs_neither_the_suite_nor_the_evidence_side() -> None:
    # `inspect` reads a checkpoint torch-free: the commit protocol's receipts, nothing else.
    elsewhere = ("dcp_invariant.suite", "dcp_invariant.evidence")
    for name, targets in _imports().items():
        if name.startswith("dcp_invariant.inspection"):
            assert not [t for t in targets if t.startswith(elsewhere)], name


def test_shared_modules_stand_on_the_standard_library() -> None:
    graph = _imports()
    # errors.py is the one package module they may import: it holds only exceptions.
    assert graph["dcp_invariant.errors"] == set()
    shared = ("canonical", "dcp_layout", "fixture_inputs", "plan", "regular_file", "runtimes")
    # ...and each other (plan takes the evidence's number limits from canonical): they stand on
    # the standard library together, and the cycle test below keeps them from leaning in circles.
    allowed = {"dcp_invariant", "dcp_invariant.errors"} | {f"dcp_invariant.{m}" for m in shared}
    for name in (f"dcp_invariant.{module}" for module in shared):
        assert graph[name] <= allowed, (name, graph[name])


def test_the_import_graph_has_no_cycles() -> None:
    graph = _imports()
    # A package's __init__ importing its own modules is how a curated namespace works.
    edges = {
        name: {t for t in targets if not name.startswith(t + ".") and t != name}
        for name, targets in graph.items()
    }
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError(" -> ".join([*path[path.index(name) :], name]))
        if name in done:
            return
        for target in sorted(edges.get(name, ())):
            visit(target, [*path, name])
        done.add(name)

    for name in sorted(edges):
        visit(name, [])


def _imported_at_module_level(path: Path) -> set[str]:
    """What a module imports when it is imported: its top-level statements, ``if`` and ``try``
    blocks included, not what a function imports when it runs."""
    found: set[str] = set()
    todo: list[ast.stmt] = list(ast.parse(path.read_text(encoding="utf-8")).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody", "handlers"):
                for child in getattr(node, block, []):
                    todo += child.body if isinstance(child, ast.ExceptHandler) else [child]
    return found


RANKS = "dcp_invariant.ranks"
# The registered fixture imports torch at module level outside ranks/: the registered evidence
# names it by its module path ("fixture": "dcp_invariant.suite.registered_fixture:..."), and a
# move would change every registered artifact's bytes.
TORCH_OUTSIDE_RANKS = {"dcp_invariant.suite.registered_fixture"}


def test_only_the_rank_side_imports_torch_when_it_is_imported() -> None:
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        torch = {t for t in _imported_at_module_level(path) if t.split(".")[0] == "torch"}
        if name.startswith(RANKS) or name in TORCH_OUTSIDE_RANKS:
            continue
        assert not torch, f"{name} imports {sorted(torch)} when imported: move it to ranks/"


def test_the_parent_side_names_the_rank_side_by_string_only() -> None:
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        if name.startswith(RANKS):
            continue
        ranks = {t for t in _imported_at_module_level(path) if t.startswith(RANKS)}
        assert not ranks, f"{name} imports {sorted(ranks)}: name the task in payloads instead"
