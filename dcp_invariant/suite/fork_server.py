"""The fork server's one preloaded module, imported only there: the server dies with the runner,
then imports what every worker needs before it forks any.

multiprocessing's fork server leaves when it reads the end of its pipe to the runner, but only
after finalizing an interpreter that imported torch, which takes seconds
(``multiprocessing/forkserver.py``, ``main``); the workers it forked die with it, not with the
runner, so they would run on that long. Set here, the kernel kills it the moment the runner
dies, and its workers follow (:func:`worker.die_with_parent`).

The imports happen here rather than in multiprocessing's own preload loop, so that the
collector is off while they run and what they built is frozen before the first fork
(:func:`worker.imports_frozen`): about 0.2 s less before any worker starts (1.74 s, not
1.96 s, here). Then the libraries
the fixture's module imports (:mod:`.fixture_imports`), which the runner names in the
environment the server starts with.
"""

from __future__ import annotations

import os
import sys

from dcp_invariant.suite import fixture_imports, pool, worker

worker.die_with_parent()  # the runner's PID, from the environment the server was started with
# Out of the terminal's process group before the long preload: multiprocessing ignores SIGINT in
# the server only once its imports are done (multiprocessing/forkserver.py, ``main``).
worker.leave_terminal_session()
# Not for the workers it forks: their parent is this server.
os.environ.pop(worker.PARENT_PID_ENV, None)

worker.import_frozen(pool.PRELOAD)
_given = os.environ.pop(fixture_imports.LIBRARIES_ENV, "")
if _given:
    _preload = fixture_imports.Preload.decode(_given)
    try:
        with worker.imports_frozen(), fixture_imports.output_to(_preload.log):
            for _left in fixture_imports.import_libraries(
                _preload.imports, _preload.timeout, _preload.libraries
            ):
                # Each worker imports it again and reports what it raises (fixture_imports).
                print(f"left to the workers: {_left}", file=sys.stderr, flush=True)
    except Exception as _exc:
        # The server must start whatever happened here (multiprocessing's preload loop lets
        # anything but an ImportError end it): the workers import what was not.
        print(
            f"dcp-invariant: the fork server left the fixture's libraries: {_exc}", file=sys.stderr
        )
