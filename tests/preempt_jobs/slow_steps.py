"""A job that takes its time: ``python slow_steps.py RUN_DIR``, 8 steps of 0.25 s, each saved
with a temporary file and ``os.replace``; it imports no torch. For the interrupt test."""

from __future__ import annotations

import os
import sys
import time

ckpt = os.path.join(sys.argv[1], "step.txt")
start = 0
if os.path.exists(ckpt):
    with open(ckpt) as saved:
        start = int(saved.read())
for step in range(start + 1, 9):
    time.sleep(0.25)
    print(f"step {step} loss {step}", flush=True)
    with open(ckpt + ".tmp", "w") as file:
        file.write(str(step))
    os.replace(ckpt + ".tmp", ckpt)
