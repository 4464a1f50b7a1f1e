"""``python -m dcp_invariant.suite.fresh_interpreter JOB``: one rank's job in an interpreter of
another environment (another torch release's, :mod:`.release_env`).

The pool's own workers are forked from, or spawned by, the runner's interpreter, which imports
the runner's torch; a rank that must run another release is a fresh ``python`` of that
environment instead, given its job as JSON (:class:`.worker.Job`; payloads are JSON).
"""

from __future__ import annotations

import json
import sys

from dcp_invariant.suite import worker


def main(argv: list[str]) -> int:
    fields = json.loads(argv[0])
    job = worker.Job(**fields)
    try:
        worker.start_in_workspace(job)
    except SystemExit as exc:  # the task failed: worker.run printed the user's frames
        return worker.exit_status(exc.code)
    return 0


if __name__ == "__main__":
    # As torchrun's launcher does: the pool waits for this process, and finalizing torch takes
    # about a second for nothing.
    worker.exit_without_teardown(main(sys.argv[1:]))
