"""``single_process.py --save atomic`` whose first relaunch on each SIGTERM point's state aborts:
``python aborts_after_sigterm.py RUN_DIR ARGS...``. preempt keeps each such state in a directory
of its own (``t000/run``); the abort marks it there, so the relaunch on the untouched copy
goes on. A job that fails now and then at a resume, as one that aborts as its interpreter
exits does."""

from __future__ import annotations

import os
import runpy
import sys

run_dir = sys.argv[1]
point = os.path.dirname(os.path.abspath(run_dir))
marker = os.path.join(point, "aborted")
resumed = os.path.exists(os.path.join(run_dir, "ckpt.pt"))
if os.path.basename(point).startswith("t0") and resumed and not os.path.exists(marker):
    open(marker, "w").close()  # closed at once
    os.abort()
job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "single_process.py")
sys.argv = [job, *sys.argv[1:]]
runpy.run_path(job, run_name="__main__")
