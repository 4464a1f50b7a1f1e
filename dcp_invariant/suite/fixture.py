"""The fixture interface every training scenario goes through, the registered one included.

A fixture is a callable ``(rank, world_size) -> app``; the app follows DCP's ``Stateful``
protocol plus ``step()``. Each top-level key of ``app.state_dict()`` is a component that is
digested and compared on its own, so a failed resume names the component that diverged.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
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
    if not isinstance(app, App):
        raise FixtureError(
            f"fixture {spec!r} returned a {type(app).__name__}, which lacks "
            "state_dict(), load_state_dict(sd) or step()"
        )
    return app
