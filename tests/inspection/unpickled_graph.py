"""What an unpickler load gives, as a value two loads can be compared by: the inspect tests
compare the interpreter's paths (inline and handlers, templates and opcodes) with it. No
hypothesis here: the template tests, which the integration job collects without it, use it too."""

from __future__ import annotations

from dcp_invariant.inspection.unpickler import Instance, PickledDict


def graph(value: object) -> object:
    """A value as nested plain tuples, shared and cyclic references numbered: two loads are
    equal when their graphs are. A tuple of plain values is compared by value alone: a
    template (unpickler._Templates) gives the equal torch.Size arguments of a file one tuple,
    where the opcodes make one each, and a tuple never changes, so which one it is cannot
    change what is read."""
    seen: dict[int, int] = {}

    def plain(v: object) -> bool:
        if isinstance(v, tuple):
            return all(plain(item) for item in v)
        return not isinstance(v, (Instance, PickledDict, list))

    def walk(v: object) -> object:
        if isinstance(v, (Instance, PickledDict, list, tuple)) and not plain(v):
            if id(v) in seen:
                return ("ref", seen[id(v)])
            seen[id(v)] = len(seen)
        if isinstance(v, Instance):
            return ("instance", v.cls.dotted, "unset" if not v.built else walk(v.state))
        if isinstance(v, PickledDict):
            return ("dict", tuple(walk(pair) for pair in v.pairs))
        if isinstance(v, (list, tuple)):
            return (type(v).__name__, tuple(walk(item) for item in v))
        return ("value", type(v).__name__, v)

    return walk(value)
