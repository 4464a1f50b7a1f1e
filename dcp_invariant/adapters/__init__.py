"""Adapters that turn a framework's training loop into an app that saves itself: its own
checkpoint code (``fabric.save``/``fabric.load``, ``accelerator.save_state``/``load_state``) is
what the scenarios check, run in the tool's process group without launcher fakes.

Each adapter imports its framework lazily: ``import dcp_invariant.adapters.fabric`` needs no
Lightning until an app is built, and without it the run stops with one line naming the extra.
"""

from __future__ import annotations

import importlib
from types import ModuleType

# Raised here, defined with every other bad input (dcp_invariant.errors).
from dcp_invariant.errors import FrameworkMissing as FrameworkMissing
from dcp_invariant.suite.fixture import names_the_module

# The releases the adapters are tested against (pyproject.toml's `frameworks` extra).
EXTRA = "frameworks"


def framework(module: str, distribution: str, adapter: str) -> ModuleType:
    """``module`` imported, or :class:`FrameworkMissing` naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is None or not names_the_module(exc.name, module):
            raise  # the framework is there, and something it imports is not: its own error
        raise FrameworkMissing(
            f"dcp_invariant.adapters.{adapter} needs {distribution}, which this Python lacks: "
            f"pip install 'dcp-invariant[{EXTRA}]' (or {distribution} itself)"
        ) from None
