"""``dcp-invariant inspect DIR``: check a DCP checkpoint directory without torch and without
running its pickle. Standard library only; imports nothing from the torch-running suite."""

from dcp_invariant.inspection.checkpoint import inspect_checkpoint
from dcp_invariant.inspection.report import Inspection

__all__ = ["Inspection", "inspect_checkpoint"]
