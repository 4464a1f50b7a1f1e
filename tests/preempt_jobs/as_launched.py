"""A job whose every step line shows how it was launched: ``python as_launched.py RUN_DIR``.

Its loss is a digest of what a fresh ``python script.py`` sets and a relaunch must set alike
(``sys.argv[0]``, the argument count, ``__name__``, ``sys.path[0]``, the working directory,
the environment but the tool's own interposer variables), so a relaunch that ran it otherwise
than the uninterrupted launches resumes "to another result". It imports no torch and saves its
step with a temporary file and ``os.replace``.

Its final state, ``final.txt``, is written as the interpreter's exit leaves it: by a file it
never closes, a non-daemon thread the exit waits for, then an atexit handler; a relaunch that
ended otherwise would leave other bytes.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import sys
import threading
import time

run_dir = sys.argv[1]
ckpt = os.path.join(run_dir, "step.json")
environment = sorted(
    (k, v) for k, v in os.environ.items() if not k.startswith(("DCP_INVARIANT_", "LD_PRELOAD"))
)
launched = json.dumps([sys.argv[0], len(sys.argv), __name__, sys.path[0], os.getcwd(), environment])
digest = hashlib.sha256(launched.encode()).hexdigest()[:16]
start = 0
if os.path.exists(ckpt):
    with open(ckpt) as saved:
        start = json.load(saved)["step"]
for step in range(start + 1, 5):
    print(f"step {step} loss {int(digest, 16) % 10**9}.{step}")
    with open(ckpt + ".tmp", "w") as file:
        json.dump({"step": step}, file)
    os.replace(ckpt + ".tmp", ckpt)

final = open(os.path.join(run_dir, "final.txt"), "w")  # noqa: SIM115  # the exit flushes it
# Held in a reference cycle, as a framework's objects often are: only the exit's collection
# would free (and flush) it otherwise.
cycle: list[object] = [final]
cycle.append(cycle)
final.write(f"{digest}\n")


def late() -> None:
    time.sleep(0.2)
    final.write("thread\n")


threading.Thread(target=late).start()
atexit.register(lambda: final.write("atexit\n"))
