"""dcp-invariant: proves that PyTorch Distributed Checkpoint resumes are exact.

``dcp_invariant.check(fixture, ...)`` runs the checks from Python and returns a :class:`Report`;
bad input raises :class:`BadInput`; every error it raises on purpose is an :class:`Error`.
Importing the package imports no torch.
"""

from dcp_invariant.errors import BadInput, Error
from dcp_invariant.python_api import Diagnosis, Report, ScenarioResult, check

# The one place the version is written: the build (pyproject.toml's [tool.hatch.version]) and the
# release workflow's tag check read it here.
__version__ = "0.5.0"
__all__ = ["BadInput", "Diagnosis", "Error", "Report", "ScenarioResult", "__version__", "check"]
