"""dcp-invariant: proves that PyTorch Distributed Checkpoint resumes are exact.

``dcp_invariant.check(fixture, ...)`` runs the checks from Python and returns a :class:`Report`;
bad input raises :class:`BadInput`; every error it raises on purpose is an :class:`Error`.
Importing the package imports no torch.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing's, without importing typing (13 ms); mypy takes it as True
if TYPE_CHECKING:
    from dcp_invariant.errors import BadInput, Error
    from dcp_invariant.python_api import (
        CrashPoint,
        Diagnosis,
        JobReport,
        Report,
        ScenarioResult,
        check,
        check_job,
    )

# The one place the version is written: the build (pyproject.toml's [tool.hatch.version]) and the
# release workflow's tag check read it here.
__version__ = "0.5.0"
__all__ = [
    "BadInput",
    "CrashPoint",
    "Diagnosis",
    "Error",
    "JobReport",
    "Report",
    "ScenarioResult",
    "__version__",
    "check",
    "check_job",
]

# Each public name's module, imported on first use (PEP 562): `python -m dcp_invariant` and the
# command's entry point import this package first, and a Ctrl-C while they import it must find
# the command's own handler in place (__main__.py), not a KeyboardInterrupt traceback.
_LAZY = {
    "BadInput": "dcp_invariant.errors",
    "Error": "dcp_invariant.errors",
    "Diagnosis": "dcp_invariant.python_api",
    "Report": "dcp_invariant.python_api",
    "ScenarioResult": "dcp_invariant.python_api",
    "check": "dcp_invariant.python_api",
    "check_job": "dcp_invariant.python_api",
    "CrashPoint": "dcp_invariant.python_api",
    "JobReport": "dcp_invariant.python_api",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dcp_invariant' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
