"""``python -m dcp_invariant.suite.torchrun.launch [torchrun arguments]``: torchrun, guarded.

Python swallows an exception raised in ``sitecustomize`` and carries on, so a guard installed
there would let torchrun run unguarded after printing "Error in sitecustomize". Here the guard
runs first in the launcher itself, and a refusal ends the process before torch's own
``torch.distributed.run`` entry point is called.
"""

from __future__ import annotations

import os
import sys

from dcp_invariant.suite import worker
from dcp_invariant.suite.torchrun import guard

GUARD_REFUSED_EXIT_CODE = 3
# Set for an agent started ahead of need (:mod:`.agent`): torch's launcher runs once GO_LINE
# arrives on standard input; at end of input the agent exits 0, having started nothing.
STANDBY_ENV = "DCP_INVARIANT_AGENT_STANDBY"
GO_LINE = b"go\n"
# The ranks' PYTHONPATH, given to them at go: the agent's own is this package's alone.
RANKS_PATH_ENV = "DCP_INVARIANT_RANKS_PYTHONPATH"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    worker.die_with_parent()
    os.environ[worker.PARENT_PID_ENV] = str(os.getpid())  # the agent starts the ranks itself
    try:
        guard.install(os.environ.get(guard.ATTESTATION_ENV))
    except guard.GuardError as exc:
        print(f"dcp-invariant: torchrun guard refused to start: {exc}", file=sys.stderr)
        return GUARD_REFUSED_EXIT_CODE
    worker.import_frozen(["torch.distributed.run"])
    from torch.distributed.run import main as torchrun_main

    if os.environ.pop(STANDBY_ENV, None) is not None and sys.stdin.buffer.readline() != GO_LINE:
        return 0  # the run did not need this agent
    ranks_path = os.environ.pop(RANKS_PATH_ENV, None)
    if ranks_path is not None:
        os.environ["PYTHONPATH"] = ranks_path
    torchrun_main(args)
    return 0


if __name__ == "__main__":
    # The elastic scenario waits for this process to end: skip finalizing torch (~1 s).
    worker.exit_without_teardown(main())
