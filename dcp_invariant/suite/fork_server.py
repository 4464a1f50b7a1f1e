"""Imported first by the fork server, and only there: the fork server dies with the runner.

multiprocessing's fork server leaves when it reads the end of its pipe to the runner, but only
after finalizing an interpreter that imported torch, which takes seconds
(``multiprocessing/forkserver.py``, ``main``); the workers it forked die with it, not with the
runner, so they would run on that long. Set here, the kernel kills it the moment the runner
dies, and its workers follow (:func:`worker.die_with_parent`).
"""

from __future__ import annotations

import os

from dcp_invariant.suite import worker

worker.die_with_parent()  # the runner's PID, from the environment the server was started with
# Out of the terminal's process group before the long preload: multiprocessing ignores SIGINT in
# the server only once its imports are done (multiprocessing/forkserver.py, ``main``).
worker.leave_terminal_session()
# Not for the workers it forks: their parent is this server.
os.environ.pop(worker.PARENT_PID_ENV, None)
