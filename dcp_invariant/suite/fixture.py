"""The fixture interface every training scenario goes through, the registered one included.

A fixture is a callable ``(rank, world_size) -> app``. The app has ``step()`` and one of two
checkpointing shapes: DCP's ``Stateful`` protocol (``state_dict()``/``load_state_dict()``; the
tool saves and loads ``{"app": app}`` through DCP), or its own ``save(dir)``/``load(dir)`` (its
framework's checkpoint code, which the tool calls and never replaces). Each top-level key of
``app.state_dict()``, where there is one, is a component that is digested and compared on its
own, so a failed resume names the component that diverged.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import signal
import sys
import sysconfig
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, Protocol, runtime_checkable

from dcp_invariant.errors import AppRaised, FixtureError
from dcp_invariant.plan import (
    DCP_SHAPE,
    DECLARATIONS,
    AppMethod,
    AppShape,
    Checkpointing,
    own_shape,
)


@runtime_checkable
class App(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...

    def step(self) -> float:
        """Run one training step on this rank and return the global loss."""
        ...


@runtime_checkable
class SavingApp(Protocol):
    """An app that writes and reads its own checkpoints. ``state_dict()`` is optional: with it,
    the state its ``load`` restored is compared key by key with the state at its ``save``."""

    def save(self, checkpoint_dir: str) -> None:
        """Write this rank's part of a checkpoint into ``checkpoint_dir``, which exists."""
        ...

    def load(self, checkpoint_dir: str) -> None:
        """Restore this rank's state from a checkpoint ``save`` wrote into ``checkpoint_dir``."""
        ...

    def step(self) -> float: ...


Fixture = Callable[..., App | SavingApp]  # (rank, world_size, **fixture_args)


def load_fixture(spec: str, arguments: Mapping[str, Any] | None = None) -> Fixture:
    """Resolve ``"package.module:callable"`` to the fixture callable, checking that it can be
    called as ``CALLABLE(rank, world_size, **arguments)``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise FixtureError(f"fixture {spec!r}: expected 'package.module:callable'")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is None or not names_the_module(exc.name, module_name):
            raise FixtureError(_import_failure(spec, module_name, exc)) from None
        raise FixtureError(_not_found(spec, module_name, exc)) from None
    except SyntaxError as exc:  # and IndentationError, TabError: the module cannot even compile
        where = f"{exc.filename}:{exc.lineno}: " if exc.filename else ""
        raise FixtureError(
            f"fixture {spec!r}: importing {module_name!r} failed: {where}"
            f"{type(exc).__name__}: {exc.msg}; fix the module so that 'import {module_name}' "
            "succeeds"
        ) from None
    except BaseException as exc:
        # Whatever the module's own code raises while it is imported (a SystemExit too): the
        # interface check cannot even start, so this is bad input, shown as one line at the
        # frame that raised. A real Ctrl-C stops the run instead.
        if is_an_interrupt(exc):
            raise
        raise FixtureError(_import_failure(spec, module_name, exc)) from None
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise FixtureError(
                f"fixture {spec!r}: {module_name!r} has no attribute {attr!r}"
            ) from exc
    if not callable(target):
        raise FixtureError(f"fixture {spec!r}: {attr!r} is not callable")
    _check_signature(spec, attr, target, arguments or {})
    fixture: Fixture = target
    return fixture


def _check_signature(
    spec: str, attr: str, target: Callable[..., Any], arguments: Mapping[str, Any]
) -> None:
    """The fixture is called as ``CALLABLE(rank, world_size, **arguments)``: one that cannot
    bind those would raise TypeError in every scenario, so it is bad input, found here."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return  # a builtin or extension callable without one: the call itself will tell
    try:
        signature.bind(0, 1, **arguments)
    except TypeError as exc:
        # Names and defaults only: annotations may be strings (PEP 563), which read badly.
        bare = signature.replace(
            parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
            return_annotation=signature.empty,
        )
        given = "".join(f", {name}=..." for name in arguments)
        try:
            signature.bind_partial(0, 1)
        except TypeError:
            fix = "a fixture takes rank and world_size as its first two parameters"
        else:
            fix = (
                "pass its other parameters with --fixture-arg NAME=VALUE, or give them defaults"
                if not arguments
                else "pass only the --fixture-arg names it takes, and every one it needs"
            )
        raise FixtureError(
            f"fixture {spec!r}: {attr}{bare} cannot be called as {attr}(rank, world_size"
            f"{given}) ({exc}); {fix}"
        ) from None


def names_the_module(missing: str, module_name: str) -> bool:
    """Whether the missing module is the fixture's own (or a package on its dotted path)."""
    return missing == module_name or module_name.startswith(missing + ".")


def _import_failure(spec: str, module_name: str, exc: BaseException) -> str:
    frame = _raising_frame(exc)
    where = f"{frame.filename}:{frame.lineno}: " if frame is not None else ""
    message = str(exc).strip().splitlines()
    detail = f"{type(exc).__name__}: {message[0]}" if message else type(exc).__name__
    fix = f"fix the module so that 'import {module_name}' succeeds"
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.partition(".")[0]
        fix = _src_layout(top) or f"install {top} for this Python, or {fix}"
    return f"fixture {spec!r}: importing {module_name!r} failed: {where}{detail}; {fix}"


def _not_found(spec: str, module_name: str, exc: ModuleNotFoundError) -> str:
    """The fixture's own module (or a package on its path) is nowhere on ``sys.path``."""
    top = module_name.partition(".")[0]
    fix = _src_layout(top) or f"check the name, run where {top} is, or install it"
    return (
        f"fixture {spec!r}: cannot import {module_name!r} ({exc}) from {_current_directory()} "
        f"(the current directory) or PYTHONPATH, nor is it installed; {fix}"
    )


def _current_directory() -> str:
    """The directory dcp-invariant was run in: ``run`` puts it first on ``sys.path``
    (cli._run), and workers inherit ``sys.path`` but work in their scenario's workspace."""
    first = sys.path[0] if sys.path else ""
    return first if os.path.isabs(first) else os.getcwd()


def _src_layout(top: str) -> str | None:
    """A src/ layout's fix: its packages are importable only with src/ on the path."""
    src = Path(_current_directory(), "src")
    searched = {os.path.realpath(p) for p in sys.path if p}
    if os.path.realpath(src) in searched:
        return None  # PYTHONPATH=src is given already: something else is wrong
    try:
        under_src = (src / top).is_dir() or (src / f"{top}.py").is_file()
    except OSError:
        # A name longer than a file name can be (ENAMETOOLONG): nothing under src/ has it, and
        # the message this hint is for must still be given.
        under_src = False
    if under_src:
        return f"{top} is under src/: run with PYTHONPATH=src (or install the project)"
    return None


def _raising_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The frame to show for an exception raised while importing the fixture's module.

    The deepest frame in the user's own files: not importlib's (frozen), not the standard
    library's or an installed package's, not this tool's. Else the deepest real file's.
    """
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    installed = {
        str(Path(p).resolve())
        for p in (sysconfig.get_paths().get(k) for k in ("stdlib", "purelib", "platlib"))
        if p
    }
    installed.add(str(Path(__file__).resolve().parent.parent))
    for frame in reversed(frames):
        path = str(Path(frame.filename).resolve())
        if not any(path.startswith(root + os.sep) for root in installed):
            return frame
    return frames[-1] if frames else None


class Anchored:
    """The user's app, with the worker's working directory put back after every call into it.

    Checkpoint ids stay relative to the scenario's workspace (DCP records the id in
    ``.metadata``: ``StorageMeta.checkpoint_id`` in torch/distributed/checkpoint/metadata.py,
    and the evidence must hold no path), so a loop that calls ``os.chdir`` would otherwise
    send DCP's reads and writes into its own directory.

    ``checkpointing`` says who saves: ``"app"`` when the app has its own ``save`` and ``load``
    (then ``state_dict()`` is optional: ``has_state``, and it may declare ``reshards`` and
    ``saves_async``: :class:`dcp_invariant.plan.AppShape`), else ``"dcp"``.
    """

    def __init__(self, app: Any, home: str) -> None:
        self.app = app
        self._home = home
        self.checkpointing: Checkpointing = "app" if _saves_itself(app) else "dcp"
        self.has_state = callable(getattr(app, "state_dict", None))
        own = self.checkpointing == "app"
        # A DCP app's attributes of these names are its own business: the tool reshards it and
        # saves it asynchronously itself.
        self.reshards: bool = own and getattr(app, "reshards", False) is True
        self.saves_async: bool = own and getattr(app, "saves_async", False) is True

    @property
    def shape(self) -> AppShape:
        if self.checkpointing == "dcp":
            return DCP_SHAPE.copy()
        return own_shape(
            has_state=self.has_state, reshards=self.reshards, saves_async=self.saves_async
        )

    def save(self, checkpoint_dir: str) -> Any:
        """The app's save; what it returned (a future, for an app that saves asynchronously)."""
        with self._calling("save"):
            return self.app.save(checkpoint_dir)

    def load(self, checkpoint_dir: str) -> None:
        with self._calling("load"):
            self.app.load(checkpoint_dir)

    def state_dict(self) -> dict[str, Any]:
        with self._calling("state_dict"):
            state: dict[str, Any] = self.app.state_dict()
            return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        with self._calling("load_state_dict"):
            self.app.load_state_dict(state_dict)

    def step(self) -> float:
        with self._calling("step"):
            loss: float = self.app.step()
            return loss

    @contextmanager
    def _calling(self, method: AppMethod) -> Iterator[None]:
        try:
            with users_code(method):
                yield
        finally:
            os.chdir(self._home)


@contextmanager
def users_code(method: AppMethod) -> Iterator[None]:
    """A call into the user's code: what it raises is :class:`AppRaised`, naming ``method``.

    Any ``BaseException`` counts: torch's ``CheckpointException`` derives from it
    (torch/distributed/checkpoint/api.py), and so do the ``SystemExit``, ``KeyboardInterrupt``
    and ``GeneratorExit`` a loop may raise; left alone, each ended the rank unreported. Only a
    real SIGINT (:func:`take_interrupts`) and the tool's own refusals pass through.
    """
    try:
        yield
    except (AppRaised, FixtureError):
        raise  # raised by the tool around a nested call (a Stateful's load inside DCP's load)
    except BaseException as exc:
        if is_an_interrupt(exc):
            raise
        raise AppRaised(method, exc) from exc


# Set once this process has received SIGINT: a KeyboardInterrupt is then the signal's, which
# must stop the rank, and not one the user's code raised. ``_told`` says whether this process
# can tell the two apart at all (:func:`take_interrupts` ran).
_signalled = threading.Event()
_told = threading.Event()


def _on_interrupt(signum: int, frame: FrameType | None) -> None:
    _signalled.set()
    signal.default_int_handler(signum, frame)


def take_interrupts() -> None:
    """Tell a real SIGINT from a ``KeyboardInterrupt`` the user's code raises; from a rank's main
    thread, before the fixture is imported."""
    handler = signal.getsignal(signal.SIGINT)
    if handler is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_interrupt)
    if handler in (signal.default_int_handler, signal.SIG_IGN):  # ignored: none is a signal's
        _told.set()


def is_an_interrupt(exc: BaseException) -> bool:
    """``exc`` is a Ctrl-C's, to be let through: a KeyboardInterrupt in a process that received
    SIGINT, or in one that cannot tell (the runner's own)."""
    return isinstance(exc, KeyboardInterrupt) and (_signalled.is_set() or not _told.is_set())


def _has(app: Any, method: str) -> bool:
    return callable(getattr(app, method, None))


def _saves_itself(app: Any) -> bool:
    return _has(app, "save") and _has(app, "load")


# The two shapes an app may have, as a message names them.
_SHAPES = (
    "the app needs step() -> float and either state_dict() and load_state_dict(sd) (the tool "
    "saves through DCP) or save(checkpoint_dir) and load(checkpoint_dir) (the app saves itself)"
)


def build_app(
    spec: str, rank: int, world_size: int, arguments: Mapping[str, Any] | None = None
) -> Anchored:
    home = os.getcwd()
    fixture = load_fixture(spec, arguments)
    try:
        with users_code("fixture"):
            app = fixture(rank, world_size, **(arguments or {}))
    finally:
        os.chdir(home)
    check_shape(spec, app)
    return Anchored(app, home)


def check_shape(spec: str, app: Any) -> None:
    """The app has ``step()`` and a whole checkpointing shape; else one line naming what lacks."""
    kind = type(app).__name__
    if _has(app, "save") != _has(app, "load"):
        has, lacks = ("save", "load") if _has(app, "save") else ("load", "save")
        raise FixtureError(
            f"fixture {spec!r} returned a {kind} with {has}() but no {lacks}(): an app that "
            f"saves itself needs both save(checkpoint_dir) and load(checkpoint_dir)"
        )
    if _saves_itself(app):
        for name, meaning in DECLARATIONS.items():
            value = getattr(app, name, False)
            if not isinstance(value, bool):
                raise FixtureError(
                    f"fixture {spec!r} returned a {kind} whose {name} is {value!r}: set it to "
                    f"True if {meaning}, else False or leave it out"
                )
    # An app that saves itself needs no state_dict(): with one, the tool compares it, and
    # nothing loads through load_state_dict().
    needed = ["step"] if _saves_itself(app) else ["state_dict", "load_state_dict", "step"]
    missing = [m for m in needed if not _has(app, m)]
    if missing:
        raise FixtureError(
            f"fixture {spec!r} returned a {kind}, which lacks "
            + ", ".join(f"{m}()" for m in missing)
            + f": {_SHAPES}"
        )


def checked_state(spec: str, state: Any) -> Mapping[str, Any]:
    """What ``state_dict()`` returned, if DCP can save it."""
    if not isinstance(state, Mapping):
        raise FixtureError(
            f"fixture {spec!r}: state_dict() returned a {type(state).__name__}, not a mapping "
            "(DCP saves a dict of tensors and values)"
        )
    return state


def checked_loss(spec: str, loss: Any) -> float:
    """``step()``'s loss as a finite float (what the probe requires of the first step)."""
    value = loss_value(spec, loss)
    if not math.isfinite(value):
        raise FixtureError(f"fixture {spec!r}: step() returned {loss!r}, expected a finite float")
    return value


def loss_value(spec: str, loss: Any) -> float:
    """``step()``'s loss as a float, finite or not; a tensor of one element is accepted as
    torch's own losses are. A later step's NaN is the loop's behaviour, recorded and judged
    (``non-finite loss``), not a malformed interface."""
    try:
        value = float(loss)
    except (TypeError, ValueError, RuntimeError):
        raise FixtureError(
            f"fixture {spec!r}: step() returned a {type(loss).__name__}, expected a float loss"
        ) from None
    if isinstance(loss, bool):
        raise FixtureError(f"fixture {spec!r}: step() returned {loss!r}, expected a float loss")
    return value


def broken_interface(message: str) -> NoReturn:
    """The loop broke the interface after the probe: one line in the rank's log, exit 1.

    The tool's own frames would say nothing the line does not (worker.run prints a traceback
    for what a task raises); the scenario fails on the exit code, and the line reaches the
    console with the log.
    """
    print(f"fixture: {message}", flush=True)
    raise SystemExit(1)
