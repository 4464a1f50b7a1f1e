"""The commit protocol: seal a finished candidate, promote it to an immutable generation, move the
pointer last, and verify the generation's receipt before and after anything loads it.

Needs the standard library only; imports nothing from the torch-running suite.
"""

from dcp_invariant.commit.errors import (
    CommitError,
    Failure,
    LineageError,
    PointerError,
    PromotionRefused,
    ReceiptError,
    ReceiptMismatch,
    SealError,
    StaleParent,
    StoreError,
)
from dcp_invariant.commit.store import CheckpointStore, Generation

__all__ = [
    "CheckpointStore",
    "CommitError",
    "Failure",
    "Generation",
    "LineageError",
    "PointerError",
    "PromotionRefused",
    "ReceiptError",
    "ReceiptMismatch",
    "SealError",
    "StaleParent",
    "StoreError",
]
