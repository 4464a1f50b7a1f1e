"""How a rank writes an app's checkpoint and reads it back: through DCP, or the app's own way.

An app with ``state_dict()``/``load_state_dict()`` is saved and loaded as ``{"app": app}``
through DCP. An app with its own ``save(dir)``/``load(dir)`` is never put through DCP: its
framework's checkpoint code (``fabric.save``, ``accelerator.save_state``, ...) is what the
scenarios check, so the tool only hands it a directory.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from dcp_invariant import plan
from dcp_invariant.commit import after_save
from dcp_invariant.suite.fixture import Anchored, broken_interface, users_code

# A checkpoint's loader: given the verified generation's directory, it fills the app.
Loader = Callable[[str], None]


def expect(app: Anchored, planned: plan.AppShape) -> None:
    """The app built here is of the shape the plan has (the probe saw it so at world size 1):
    a rank whose app differs would be checked the wrong way, or vacuously."""
    found = app.shape
    if found["checkpointing"] != planned["checkpointing"]:
        own = "its own save() and load()" if app.checkpointing == "app" else "no save()/load()"
        broken_interface(
            f"the plan has the {_WHO[planned['checkpointing']]} save and load, but the app built "
            f"on this rank has {own}: build the same kind of app on every rank and at every "
            "world size"
        )
    parts: tuple[tuple[str, bool, bool], ...] = (
        ("a state_dict()", found["has_state"], planned["has_state"]),
        ("reshards = True", found["reshards"], planned["reshards"]),
        ("saves_async = True", found["saves_async"], planned["saves_async"]),
    )
    for what, found_it, wanted in parts:
        if found_it != wanted:
            broken_interface(
                f"the app built on this rank {'has' if found_it else 'lacks'} {what}, unlike the one "
                "the plan was made for: build the same kind of app on every rank and at every "
                "world size"
            )


_WHO: dict[plan.Checkpointing, str] = {"dcp": "tool (through DCP)", "app": "app itself"}


def save(app: Anchored, checkpoint: str, writer: Any = None) -> None:
    """Write ``app``'s checkpoint into ``checkpoint`` (relative to the scenario's workspace),
    finished when this returns: an app's async save is waited for here."""
    if app.checkpointing == "app":
        finish(start(app, checkpoint))
        # What the save wrote as it returned: the commit refuses what changes after this.
        after_save.record(checkpoint, dist.get_rank() if dist.is_initialized() else 0)
        return
    dcp_save({"app": app}, storage_writer=writer or FileSystemWriter(checkpoint))


def start(app: Anchored, checkpoint: str) -> Any:
    """Call an app's own save into ``checkpoint``: its future where it declares saves_async,
    else None once the save is done."""
    # The directory is there before the app is called, as a framework expects of a path it is
    # given to save into (fabric.save and accelerator.save_state both create it).
    Path(checkpoint).mkdir(parents=True, exist_ok=True)
    returned = app.save(checkpoint)
    waitable = callable(getattr(returned, "result", None))
    if app.saves_async and not waitable:
        broken_interface(
            f"the app declares saves_async = True, but its save() returned a "
            f"{type(returned).__name__}: return the save's future (an object with result(), as "
            "dcp.async_save's), so the tool knows when the write is done"
        )
    if not app.saves_async and waitable:
        # Sealed now, the directory may still be being written: a checkpoint the tool would
        # call whole that is not.
        broken_interface(
            f"the app's save() returned a {type(returned).__name__} with result(), as an async "
            "save does: set saves_async = True on the app so the tool waits for it (and checks "
            "the next step running beside it), or wait for it inside save()"
        )
    return returned if app.saves_async else None


def finish(pending: Any) -> None:
    """Wait for what :func:`start` returned: :class:`AppRaised` for ``save`` if the write
    failed (the framework's future raised), which the caller records or raises."""
    if pending is None:
        return
    with users_code("save"):
        pending.result()


def loader(app: Anchored, state: Any = None) -> Loader:
    """How ``app`` is filled from a generation: DCP into ``state`` (``{"app": app}`` unless a
    view of it is given), or the app's own ``load``, whose exception is :class:`AppRaised`."""
    if app.checkpointing == "dcp":
        target = {"app": app if state is None else state}
        return lambda path: dcp_load(target, checkpoint_id=path)
    return app.load
