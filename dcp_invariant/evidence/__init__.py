"""The evidence side: the artifact's schema, the observation shapes, the verdict rules, and the
offline verifier that re-derives every verdict.

Standard library only, and nothing from the torch-running suite: a downloaded artifact can be
checked on any machine (the package-boundary tests hold it to an allow-list).
"""

from dcp_invariant.evidence.verify import Verification, verify_artifact

__all__ = ["Verification", "verify_artifact"]
