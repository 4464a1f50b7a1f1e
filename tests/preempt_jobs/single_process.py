"""A single-process training job that saves itself and resumes from its own checkpoint, as a
user's script does: ``python single_process.py RUN_DIR --save {in_place,atomic}``.

``in_place`` is ``torch.save`` straight onto ``ckpt.pt``: a kill mid-write leaves it cut
short, and every relaunch then fails to load it. ``atomic`` writes a temporary file, fsyncs it
and ``os.replace``s it over ``ckpt.pt``, so a kill leaves the old checkpoint or the new one.

``--on-sigterm`` is what the job does on SIGTERM: ``die`` (Python's default), or ``save``: it
finishes the step under way, saves and exits, as jobs that save on preemption do (Lightning's
SLURM plugin); ``save_without_rng`` does so but leaves the generator's state out of that save,
so its relaunch draws other batches.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys

import torch

parser = argparse.ArgumentParser()
parser.add_argument("run_dir")
parser.add_argument("--save", choices=["in_place", "atomic"], required=True)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--every", type=int, default=2)
parser.add_argument("--on-sigterm", choices=["die", "save", "save_without_rng"], default="die")
# A job that fails now and then as it resumes, whatever it resumes from: the first resume from
# each checkpoint (its bytes named in this directory) aborts, the next goes on.
parser.add_argument("--abort-first-resume", metavar="DIR")
args = parser.parse_args()
stopping: list[int] = []
if args.on_sigterm != "die":
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
torch.set_num_threads(1)

ckpt = os.path.join(args.run_dir, "ckpt.pt")
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
start = 0
if os.path.exists(ckpt) and args.abort_first_resume:
    with open(ckpt, "rb") as saved:
        seen = os.path.join(args.abort_first_resume, hashlib.sha256(saved.read()).hexdigest())
    if not os.path.exists(seen):
        open(seen, "w").close()
        os.abort()
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    if "rng" in state:
        torch.set_rng_state(state["rng"])
    start = state["step"]


def save(step: int, rng: bool = True) -> None:
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    if rng:
        state["rng"] = torch.get_rng_state()
    if args.save == "in_place":
        torch.save(state, ckpt)
        return
    temporary = ckpt + ".tmp"
    with open(temporary, "wb") as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, ckpt)


for step in range(start + 1, args.steps + 1):
    x = torch.randn(8, 4)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item().hex()}")
    if step % args.every == 0:
        save(step)
    if stopping:
        save(step, rng=args.on_sigterm == "save")
        sys.exit(128 + signal.SIGTERM)
torch.save(model.state_dict(), os.path.join(args.run_dir, "final.pt"))
