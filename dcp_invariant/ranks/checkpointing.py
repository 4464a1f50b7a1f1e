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

from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from dcp_invariant import plan
from dcp_invariant.errors import Error
from dcp_invariant.suite.fixture import Anchored, broken_interface

# A checkpoint's loader: given the verified generation's directory, it fills the app.
Loader = Callable[[str], None]


class AppLoadFailed(Error, RuntimeError):
    """The app's own ``load()`` raised: its framework refused the checkpoint (or broke)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error


def expect(app: Anchored, planned: plan.Checkpointing) -> None:
    """The app built here checkpoints as the plan says (the probe saw it so at world size 1)."""
    if app.checkpointing != planned:
        has = "its own save() and load()" if app.checkpointing == "app" else "no save()/load()"
        broken_interface(
            f"the plan has the {_WHO[planned]} save and load, but the app built on this rank has "
            f"{has}: build the same kind of app on every rank and at every world size"
        )


_WHO: dict[plan.Checkpointing, str] = {"dcp": "tool (through DCP)", "app": "app itself"}


def save(app: Anchored, checkpoint: str, writer: Any = None) -> None:
    """Write ``app``'s checkpoint into ``checkpoint`` (relative to the scenario's workspace)."""
    if app.checkpointing == "app":
        # The directory is there before the app is called, as a framework expects of a path it
        # is given to save into (fabric.save and accelerator.save_state both create it).
        Path(checkpoint).mkdir(parents=True, exist_ok=True)
        app.save(checkpoint)
        return
    dcp_save({"app": app}, storage_writer=writer or FileSystemWriter(checkpoint))


def loader(app: Anchored, state: Any = None) -> Loader:
    """How ``app`` is filled from a generation: DCP into ``state`` (``{"app": app}`` unless a
    view of it is given), or the app's own ``load``, whose exception is :class:`AppLoadFailed`."""
    if app.checkpointing == "dcp":
        target = {"app": app if state is None else state}
        return lambda path: dcp_load(target, checkpoint_id=path)

    def own(path: str) -> None:
        try:
            app.load(path)
        except Exception as exc:  # the framework's refusal: the caller records or raises it
            raise AppLoadFailed(exc) from exc

    return own
