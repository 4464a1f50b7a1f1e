"""The fixture interface every training scenario goes through, the registered one included.

A fixture is a callable ``(rank, world_size) -> app``; the app follows DCP's ``Stateful``
protocol plus ``step()``. Each top-level key of ``app.state_dict()`` is a component that is
digested and compared on its own, so a failed resume names the component that diverged.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class App(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...

    def step(self) -> float:
        """Run one training step on this rank and return the global loss."""
        ...


Fixture = Callable[[int, int], App]


class FixtureError(ValueError):
    """A fixture spec that does not name a usable fixture."""


def load_fixture(spec: str) -> Fixture:
    """Resolve ``"package.module:callable"`` to the fixture callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise FixtureError(f"fixture {spec!r}: expected 'package.module:callable'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise FixtureError(f"fixture {spec!r}: cannot import {module_name!r} ({exc})") from exc
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
    fixture: Fixture = target
    return fixture


def build_app(spec: str, rank: int, world_size: int) -> App:
    app = load_fixture(spec)(rank, world_size)
    missing = [
        m for m in ("state_dict", "load_state_dict", "step") if not callable(getattr(app, m, None))
    ]
    if missing:
        raise FixtureError(
            f"fixture {spec!r} returned a {type(app).__name__}, which lacks "
            + ", ".join(f"{m}()" for m in missing)
            + ": the app needs state_dict(), load_state_dict(sd) and step() -> float"
        )
    assert isinstance(app, App)
    return app


def checked_state(spec: str, state: Any) -> Mapping[str, Any]:
    """What ``state_dict()`` returned, if DCP can save it."""
    if not isinstance(state, Mapping):
        raise FixtureError(
            f"fixture {spec!r}: state_dict() returned a {type(state).__name__}, not a mapping "
            "(DCP saves a dict of tensors and values)"
        )
    return state


def checked_loss(spec: str, loss: Any) -> float:
    """``step()``'s loss as a float; a tensor of one element is accepted as torch's own losses are."""
    try:
        value = float(loss)
    except (TypeError, ValueError, RuntimeError):
        raise FixtureError(
            f"fixture {spec!r}: step() returned a {type(loss).__name__}, expected a float loss"
        ) from None
    if isinstance(loss, bool) or not math.isfinite(value):
        raise FixtureError(f"fixture {spec!r}: step() returned {loss!r}, expected a finite float")
    return value
