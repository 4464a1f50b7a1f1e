"""Fingerprints of the app's own objects: what steers training, wherever the app keeps it.

``state_dict()`` shows what the app chose to save; a resume bug is what it forgot. So besides
the state dict, a rank walks the app object's attributes and records, by attribute path, a
fingerprint of everything that can steer a step: tensors, modules (parameters and buffers),
optimizers (``state`` by parameter index, ``param_groups``), LR schedulers, generators, loss
scalers, samplers and data loaders, numbers and counters; and the global RNGs (torch's CPU
generator, Python's ``random``, NumPy's). Two walks of the same app compare key by key, as the
state records do (``"<kind> <digest>"``, or a number's own value), so the verifier can say
which attribute differs without torch.

The walk reads attributes and nothing else: no property, ``__getattr__`` or method of the
user's runs (``vars()`` and slots only), except torch's own accessors (``Generator.get_state``,
a module's ``_parameters``, an optimizer's ``state``). It is bounded in depth, in entries per
container and in attributes in all; each object is walked once, at the first path that reaches
it (cycles end there). A DTensor is fingerprinted by this rank's shard: the walk runs no
collective, so ranks whose objects differ cannot hang it.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import re
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy
import torch

from dcp_invariant.evidence import object_causes
from dcp_invariant.ranks.digest import value_digest

MAX_DEPTH = 16
MAX_ENTRIES = 256  # of one container: a longer one is recorded by its kind and length
MAX_ATTRIBUTES = 20_000
CUT_KEY = "walk"  # where a walk past MAX_ATTRIBUTES says it stopped
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_\-]{1,64}")
# Where the global RNGs are recorded, beside the app's own attributes.
GLOBAL_RNGS = ("rng.numpy", "rng.python", "rng.torch")

# What a bare module holds for torch's bookkeeping (hooks, parameters, submodules): a module's
# own attributes are the rest, and its parameters, buffers and submodules are walked by name.
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module()))
# Types whose objects hold no training state, or hold a process's resources: not walked.
_OPAQUE = (
    type,
    types.ModuleType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.GeneratorType,
    types.CoroutineType,
    property,
    torch.device,
    torch.dtype,
)
_OPAQUE_MODULES = (
    "threading",
    "multiprocessing",
    "queue",
    "socket",
    "subprocess",
    "logging",
    "io",
    "_io",
    "weakref",
    "concurrent",
    "asyncio",
    "torch.distributed",
    "torch._C",
)


def fingerprints(app: Any, root: str = "app", ignoring: Sequence[str] = ()) -> dict[str, str]:
    """``{attribute path: fingerprint}`` of ``app``'s objects and the global RNGs, sorted.

    ``ignoring``: paths (``--ignore-attr``) neither walked nor recorded, nor anything below
    them: an evaluation copy of a large model costs nothing, and counts for nothing against
    :data:`MAX_ATTRIBUTES`.
    """
    walk = _Walk(ignoring)
    walk.visit(app, root, 0)
    out = walk.found
    rngs: dict[str, Callable[[], str]] = {
        "rng.torch": lambda: "ByteTensor " + value_digest(torch.get_rng_state()),
        "rng.python": lambda: "state " + _digest(repr(random.getstate())),
        "rng.numpy": lambda: "state " + _digest(repr(numpy.random.get_state(legacy=True))),
    }
    for path, fingerprint in rngs.items():
        if not object_causes.ignored(path, ignoring):
            out[path] = fingerprint()
    return dict(sorted(out.items()))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class _Walk:
    def __init__(self, ignoring: Sequence[str]) -> None:
        self.found: dict[str, str] = {}
        self._ignoring = ignoring
        self._seen: set[int] = set()
        self._open: set[int] = set()  # the containers on the path being walked
        # Everything walked stays referenced until the walk ends: an id in _seen is then never
        # reused by a later object (the optimizer's views below are made for the walk).
        self._kept: list[Any] = []
        self._visited = 0

    def visit(self, value: Any, path: str, depth: int) -> None:
        if self._ignoring and object_causes.ignored(path, self._ignoring):
            # Seen, so that the object is not walked at another path that reaches it (an
            # ignored optimizer, also reached through its LR scheduler).
            if not issubclass(type(value), (dict, list, tuple)):
                self._seen.add(id(value))
                self._kept.append(value)
            return
        self._visited += 1
        if self._visited > MAX_ATTRIBUTES:
            if self._visited == MAX_ATTRIBUTES + 1:
                # Where the walk stopped, under a key of its own: at the path itself it could
                # stand where another run, one attribute earlier or later, records a tensor.
                self.found[CUT_KEY] = f"stopped at {path} (past {MAX_ATTRIBUTES} attributes)"[:200]
            return
        try:
            self._visit(value, path, depth)
        except Exception as exc:  # recorded, never raised: the walk must not end a correct rank
            # Whatever a user's object raised while being read (a closed shelf, a lazy module
            # not yet initialised): its kind is what there is to compare.
            self.found[path] = f"{_kind_of(value)} (unreadable: {type(exc).__name__})"

    def _visit(self, value: Any, path: str, depth: int) -> None:
        leaf = _leaf(value)
        if leaf is not None:
            self.found[path] = leaf
            return
        cls = type(value)
        # Only type(): isinstance() would ask the object for its __class__, which a user's
        # class may compute. A module or an optimizer is walked wherever torch keeps its class
        # (FSDP's and ZeroRedundancyOptimizer's are under torch.distributed).
        if issubclass(cls, _OPAQUE) or (
            _opaque_module(cls) and not issubclass(cls, (torch.nn.Module, torch.optim.Optimizer))
        ):
            return
        if issubclass(cls, torch.utils.data.dataloader._BaseDataLoaderIter):
            return  # a loader's live iterator: worker processes and queues, rebuilt each epoch
        # An object (a module, an optimizer, a sampler) is walked once, at the first path that
        # reaches it. A container is walked at every path, and only a cycle through it ends
        # there: whether two attributes share one tuple or dict (an optimizer's defaults and
        # its param_groups' betas do, until a load copies them) is not state.
        container = issubclass(cls, (dict, list, tuple))
        if id(value) in (self._open if container else self._seen):
            return
        (self._open if container else self._seen).add(id(value))
        self._kept.append(value)
        try:
            if depth >= MAX_DEPTH:
                self.found[path] = f"{_kind_of(value)} (deeper than {MAX_DEPTH})"
                return
            if container and len(value) > MAX_ENTRIES and not issubclass(cls, _Whole):
                self.found[path] = f"{_kind_of(value)} of {len(value)} entries"
                return
            for name, child in _children(value):
                self.visit(child, f"{path}.{name}", depth + 1)
        finally:
            if container:
                self._open.discard(id(value))


class _Whole(dict):  # type: ignore[type-arg]
    """A view the walk makes (an optimizer's state by parameter index): walked whatever its
    length, which the model's parameters bound."""


def _kind_of(value: Any) -> str:
    return type(value).__name__


def _opaque_module(cls: type) -> bool:
    module = cls.__module__ or ""
    return any(module == m or module.startswith(m + ".") for m in _OPAQUE_MODULES)


def _leaf(value: Any) -> str | None:
    """The fingerprint of a value that has no attributes worth walking; None for the others."""
    cls = type(value)  # never isinstance(): it would ask a user's object for __class__
    if value is None or issubclass(cls, bool):
        return repr(value)
    if issubclass(cls, int):
        return f"int {value}"
    if issubclass(cls, float):
        return f"float {value.hex()}"
    if issubclass(cls, str):
        # By kind alone: a string may be a path, a host or a user name (evidence holds none),
        # or a checkpoint's directory whose name differs from run to run; none steers a step.
        return "str"
    if issubclass(cls, (bytes, bytearray)):
        return f"bytes {hashlib.sha256(value).hexdigest()}"
    if issubclass(cls, torch.Tensor):
        return _tensor(value)
    if issubclass(cls, torch.Generator):
        return "Generator " + value_digest(value.get_state())
    if issubclass(cls, numpy.ndarray):
        kind = f"ndarray {value.dtype}{list(value.shape)}"
        if value.dtype.hasobject or issubclass(cls, numpy.memmap):
            # Object arrays hold pointers, which differ by process; a memmap is a file, read
            # whole at every walk: by kind and shape alone.
            return kind
        data = numpy.ascontiguousarray(value).view(numpy.uint8).ravel()
        return f"{kind} {hashlib.sha256(data).hexdigest()}"
    if issubclass(cls, numpy.generic):
        return _leaf(value.item())
    return None


def _tensor(value: torch.Tensor) -> str:
    if issubclass(type(value), torch.nn.parameter.UninitializedTensorMixin):
        return "uninitialized"  # a lazy module's, before its first forward
    tensor = value.detach()
    if hasattr(tensor, "to_local") and hasattr(tensor, "placements"):
        tensor = tensor.to_local()  # this rank's shard: no collective (module docstring)
    shape = f"{str(tensor.dtype).removeprefix('torch.')}[{','.join(map(str, tensor.shape))}]"
    if tensor.is_meta or tensor.layout != torch.strided or tensor.is_nested:
        return f"{shape} {tensor.layout} {tensor.device.type}"  # no data to fingerprint
    try:
        return f"{shape} {value_digest(tensor)}"
    except (RuntimeError, NotImplementedError, TypeError):
        # A tensor subclass whose bytes cannot be read: its kind is all there is to compare.
        return f"{shape} {type(value).__name__}"


def _children(value: Any) -> list[tuple[str, Any]]:
    """What to walk under ``value``, by name, in a stable order."""
    # Entries of a dict only: any other Mapping's __getitem__ may be user code (a shelf, a lazy
    # config); it is walked by its attributes.
    cls = type(value)
    if issubclass(cls, dict):
        return _entries(value)
    if issubclass(cls, (list, tuple)):
        return [(str(i), item) for i, item in enumerate(value)]
    if issubclass(cls, types.FunctionType):
        # A closure's cells: a loop written as functions keeps its state there (a nonlocal
        # cursor, the model a step() captured). A function's globals are not its state.
        cells = value.__closure__ or ()
        return [
            (name, cell.cell_contents)
            for name, cell in zip(value.__code__.co_freevars, cells, strict=False)
            if _cell_filled(cell)
        ]
    if issubclass(cls, torch.optim.Optimizer):
        return _optimizer(value)
    if issubclass(cls, torch.nn.Module):
        return _module(value)
    return _attributes(value)


def _cell_filled(cell: types.CellType) -> bool:
    try:
        cell.cell_contents  # noqa: B018  # raises ValueError while the cell is empty
    except ValueError:
        return False
    return True


# An int key this large is an object's id() (a memory address), as in a dict keyed by
# id(param): it differs from process to process, so it is named by its place in the dict.
_ID_LIKE = 1 << 32


def _entries(mapping: Mapping[Any, Any]) -> list[tuple[str, Any]]:
    """A dict's entries by name: plain keys in ``repr`` order, then keys that look like an
    object's id() in insertion order (``#0``, ``#1``...), which a deterministic loop repeats."""
    plain, ids = [], []
    for k in mapping:
        if type(k) is int and abs(k) >= _ID_LIKE:
            ids.append(k)
        elif isinstance(k, (str, int, float, bool)) or k is None:
            plain.append(k)
    named = [(_name(k), mapping[k]) for k in sorted(plain, key=repr)]
    return named + [(f"#{i}", mapping[k]) for i, k in enumerate(ids)]


def _name(key: Any) -> str:
    """A dict key as a path component: itself when it is a plain name, else a digest of it (a
    key may be a file path or a host name, which the evidence must not hold)."""
    text = str(key)
    if _PLAIN_NAME.fullmatch(text):
        return text
    return "key~" + _digest(repr(key))[:16]


def _attributes(value: Any) -> list[tuple[str, Any]]:
    """An object's instance attributes: its ``__dict__`` and slots, never a property."""
    found: dict[str, Any] = {}
    # object.__getattribute__, not vars(): the class's own __getattribute__ or __getattr__ is
    # user code. An object without a __dict__ has its slots alone, or nothing to walk.
    with contextlib.suppress(AttributeError):
        instance = object.__getattribute__(value, "__dict__")
        if isinstance(instance, dict):
            found.update(instance)
    for cls in type(value).__mro__:
        for slot in cls.__dict__.get("__slots__", ()):
            if isinstance(slot, str) and slot not in ("__dict__", "__weakref__"):
                member = cls.__dict__.get(slot)
                if isinstance(member, types.MemberDescriptorType):
                    with contextlib.suppress(AttributeError):  # a slot never assigned: nothing
                        found.setdefault(slot, member.__get__(value, cls))
    return sorted(found.items())


def _module(module: torch.nn.Module) -> list[tuple[str, Any]]:
    """Parameters, buffers and submodules by name, then the module's own other attributes."""
    named: dict[str, Any] = {}
    for table in (module._parameters, module._buffers, module._modules):
        named.update((k, v) for k, v in table.items() if v is not None)
    own = [(k, v) for k, v in vars(module).items() if k not in _MODULE_INTERNALS]
    return sorted(named.items()) + sorted(own)


def _optimizer(optimizer: torch.optim.Optimizer) -> list[tuple[str, Any]]:
    """``state`` by parameter index (its order in ``param_groups``), ``param_groups`` without
    the parameters themselves (the model has them), and ``defaults``."""
    order = [p for group in optimizer.param_groups for p in group["params"]]
    index = {id(p): i for i, p in enumerate(order)}
    state = _Whole((index[id(p)], s) for p, s in optimizer.state.items() if id(p) in index)
    groups = [
        {**{k: v for k, v in group.items() if k != "params"}, "params": len(group["params"])}
        for group in optimizer.param_groups
    ]
    return [("defaults", optimizer.defaults), ("param_groups", groups), ("state", state)]
