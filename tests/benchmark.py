"""``python tests/benchmark.py``, from a checkout: what the suite costs, as ratios measured in one run.

A developer's tool, not shipped in the wheel: it runs ``examples/`` and ``tests/fixture_loops.py``.

Prints per-scenario wall time, the suite's total, peak RSS (largest process, and the whole
process tree sampled from /proc where it exists), and the total in units of one
``python -c "import torch"`` measured in the same run. Then seals a checkpoint of
``--seal-gib`` GiB and compares sealing and verifying with ``sha256sum`` over the same files.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from dcp_invariant import plan
from dcp_invariant.commit import receipt
from dcp_invariant.suite import pool

_LINE = re.compile(r"^(pass|fail)\s+(\S+)\s+([\d.]+) s$", re.M)
MIB = 1 << 20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tests/benchmark.py", description=__doc__)
    parser.add_argument(
        "--seal-gib", type=float, default=1.0, help="checkpoint size to seal (0 skips)"
    )
    parser.add_argument(
        "--imports", type=int, default=3, help="import-torch timings to take the median of"
    )
    parser.add_argument(
        "--fixture",
        default="examples.mlp_fixture:fixture",
        help="fixture run to measure next to the registered suite ('' skips)",
    )
    parser.add_argument(
        "--slow-fixture",
        default="examples.mlp_fixture:slow_fixture",
        help="a fixture with a ~100 ms step: the tool's overhead over its own steps ('' skips)",
    )
    parser.add_argument(
        "--library-fixture",
        default="llama_ddp_loop:fixture",
        help="a fixture of tests/real_loops built on transformers, at world sizes 1,2: what its "
        "workers' imports cost ('' skips)",
    )
    parser.add_argument(
        "--big-fixture",
        default="tests.fixture_loops:big_buffer",
        help="a fixture whose state holds a 1 GiB tensor, run at world size 1 ('' skips)",
    )
    parser.add_argument(
        "--no-preempt",
        dest="preempt",
        action="store_false",
        help="skip preempt on tests/preempt_jobs/single_process.py (Linux)",
    )
    parser.add_argument(
        "--no-own-save",
        dest="own_save",
        action="store_false",
        help="skip the app that saves itself next to the same loop saved through DCP",
    )
    parser.add_argument(
        "--no-spawn",
        dest="spawn",
        action="store_false",
        help="skip the registered suite on the spawn path (what macOS and Windows use)",
    )
    args = parser.parse_args(argv)

    import_seconds = _median_import(args.imports)
    print(f"python -c 'import torch': {import_seconds:.2f} s (median of {args.imports})")
    total, per_scenario, tree_peak, ok = _suite(sample_memory=True)
    print(f"\n{'scenario':<26}{'wall s':>8}")
    for name in plan.SCENARIO_NAMES:
        print(f"{name:<26}{per_scenario.get(name, float('nan')):>8.2f}")
    largest = _largest_child_rss_mib()
    print(f"\nsuite total: {total:.2f} s ({'pass' if ok else 'FAIL'})")
    print(f"suite / import torch: {total / import_seconds:.1f} units")
    if largest is not None:
        print(f"peak RSS, largest process: {largest:.0f} MiB")
    if tree_peak:
        print(f"peak RSS, whole process tree: {tree_peak / MIB:.0f} MiB")
    if args.spawn:
        spawned, _, _, spawn_ok = _suite(env={pool.START_METHOD_ENV: "spawn"})
        ok &= spawn_ok
        print(f"\nsuite with spawned workers: {spawned:.2f} s ({'pass' if spawn_ok else 'FAIL'})")
        print(f"spawn path / import torch: {spawned / import_seconds:.1f} units")
        print(f"spawn path / fork-server path: {spawned / total:.2f}")
    if args.fixture:
        ok &= _fixture_run(args.fixture, import_seconds, total)
    if args.own_save:
        ok &= _own_save(import_seconds)
    if args.slow_fixture:
        ok &= _overhead(args.slow_fixture)
    if args.library_fixture:
        ok &= _library_fixture(args.library_fixture, import_seconds)
    if args.big_fixture:
        ok &= _big_fixture(args.big_fixture, import_seconds)
    if args.preempt and sys.platform == "linux":
        ok &= _preempt(import_seconds)
    if args.seal_gib > 0:
        _seal_benchmark(args.seal_gib)
    return 0 if ok else 1


PREEMPT_JOB = ("single_process.py", "{run_dir}", "--save", "atomic", "--steps", "16")


def _preempt(import_seconds: float) -> bool:
    """preempt on a small single-process job that saves every 2 steps (8 saves): crash states
    relaunched per second, and the tool's own share of the wall time (when no launch ran)."""
    from dcp_invariant.preempt import command
    from dcp_invariant.preempt.launch import Launches

    jobs = Path(__file__).resolve().parent / "preempt_jobs"
    options = command.checked_options(
        [sys.executable, str(jobs / PREEMPT_JOB[0]), *PREEMPT_JOB[1:]],
        None,
        "final.pt",
        command.DEFAULT_CRASH_POINTS,
        command.DEFAULT_TIMEOUT,
    )
    launches = Launches()
    start = time.monotonic()
    try:
        outcome = command.check(options, launches)
    finally:
        launches.stop_all()
    wall = time.monotonic() - start
    _, code = command.report(outcome)
    states = len(outcome.relaunches)
    idle = wall - _covered(launches.spans)
    print(
        f"\npreempt, {PREEMPT_JOB[0]} {' '.join(PREEMPT_JOB[2:])}: {states} crash states in "
        f"{wall:.1f} s ({'pass' if code == 0 else 'FAIL'}), {states / wall:.2f} states/s, "
        f"{wall / import_seconds:.1f} units; the tool's own time (no launch running) "
        f"{idle:.1f} s, {100 * idle / wall:.0f}%"
    )
    return code == 0


def _covered(spans: list[tuple[float, float]]) -> float:
    """How long at least one of ``spans`` was under way."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def _fixture_run(fixture: str, import_seconds: float, registered: float) -> bool:
    """The fixture run at world sizes 1,2 (its defaults), next to the registered suite."""
    total, per_scenario, _, ok = _suite(["--fixture", fixture])
    print(f"\nfixture run of {fixture} (world sizes 1,2, N=3, K=3):")
    for name, seconds in per_scenario.items():
        print(f"{name:<26}{seconds:>8.2f}")
    print(f"fixture run total: {total:.2f} s ({'pass' if ok else 'FAIL'})")
    print(f"fixture run / import torch: {total / import_seconds:.1f} units")
    print(f"fixture run / registered suite: {total / registered:.2f}")
    return ok


# The same loop (tests/fixture_loops.py's correct one) saved through DCP and saving itself
# (tests/saving_loops.py), in the scenarios both plans have.
OWN_SAVE_PAIR = ("fixture_loops:correct", "saving_loops:saves_itself")
SHARED_SCENARIOS = ["resume_1", "resume_2", "elastic_restart_2_to_2"]


def _own_save(import_seconds: float, rounds: int = 2) -> bool:
    """An app that saves itself costs what the same app saved through DCP costs: each run
    ``rounds`` times, alternating which goes first (the first run warms the page cache), and
    the faster of its runs kept."""
    from dcp_invariant.evidence import rules
    from dcp_invariant.suite import runner

    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the loops; workers inherit it
    seconds: dict[str, list[float]] = {spec: [] for spec in OWN_SAVE_PAIR}
    passed = dict.fromkeys(OWN_SAVE_PAIR, True)
    for round_ in range(rounds):
        for spec in OWN_SAVE_PAIR if round_ % 2 == 0 else OWN_SAVE_PAIR[::-1]:
            started = time.perf_counter()
            suite = runner.run_suite(
                run_plan=plan.fixture_plan(spec, (1, 2)), names=SHARED_SCENARIOS
            )
            seconds[spec].append(time.perf_counter() - started)
            for name, obs in suite.observations.items():
                passed[spec] &= not rules.derive(name, obs, run_plan=suite.run_plan)
    print(f"\n{', '.join(SHARED_SCENARIOS)}, the faster of {rounds} runs each:")
    for spec in OWN_SAVE_PAIR:
        took = min(seconds[spec])
        verdict = "pass" if passed[spec] else "FAIL"
        print(f"{spec:<32}{took:>8.2f} s {took / import_seconds:>6.1f} units ({verdict})")
    dcp, own = (min(seconds[spec]) for spec in OWN_SAVE_PAIR)
    print(f"saving itself / through DCP: {own / dcp:.2f}")
    return all(passed.values())


_OWN_STEPS = """
import os, sys, time, importlib, tempfile
import torch, torch.distributed as dist
torch.set_num_threads(1)
module, _, attr = sys.argv[1].partition(":")
steps = int(sys.argv[2])
store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
app = getattr(importlib.import_module(module), attr)(0, 1)
started = time.perf_counter()
for _ in range(steps):
    app.step()
print(time.perf_counter() - started)
dist.destroy_process_group()
"""


def _overhead(fixture: str) -> bool:
    """Wall time of a world-size-1 fixture run against the fixture's own N+K steps."""
    steps = plan.DEFAULT_STEPS_BEFORE + plan.DEFAULT_STEPS_AFTER
    with tempfile.TemporaryDirectory(prefix="dcp-invariant-bench-") as tmp:
        env = {**os.environ, "TMPDIR": tmp, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.getcwd()}
        done = subprocess.run(
            [sys.executable, "-c", _OWN_STEPS, fixture, str(steps)],
            capture_output=True,
            text=True,
            timeout=1800,
            env=env,
            check=False,
        )
    if done.returncode != 0:
        print(f"\n{fixture}: its own steps could not be timed:\n{done.stderr}", file=sys.stderr)
        return False
    own = float(done.stdout.split()[-1])
    total, _, _, ok = _suite(["--fixture", fixture, "--world-sizes", "1"])
    print(f"\n{fixture}: its own {steps} steps {own:.2f} s ({own / steps * 1000:.0f} ms a step)")
    print(f"fixture run at world size 1: {total:.2f} s ({'pass' if ok else 'FAIL'})")
    print(f"tool overhead: {total - own:.2f} s, {total / own:.1f}x the fixture's own steps")
    return ok


REAL_LOOPS = Path(__file__).resolve().parent / "real_loops"


def _library_fixture(fixture: str, import_seconds: float) -> bool:
    """A fixture run at world sizes 1,2 of a loop whose module imports ``transformers`` (about
    1 s of CPU here): what a run's ~30 workers would pay for importing it each."""
    env = {"PYTHONPATH": os.pathsep.join([str(REAL_LOOPS), os.environ.get("PYTHONPATH", "")])}
    total, _, _, ok = _suite(["--fixture", fixture], env)
    print(f"\n{fixture} (tests/real_loops, world sizes 1,2): {total:.2f} s")
    print(
        f"its run / import torch: {total / import_seconds:.1f} units ({'pass' if ok else 'FAIL'})"
    )
    return ok


def _big_fixture(fixture: str, import_seconds: float) -> bool:
    """A world-size-1 fixture run whose state is dominated by one 1 GiB tensor (issue #15).

    Its cost is hashing, snapshots and DCP's own writes, each once per phase. On a 2-core
    machine it took 252 s while every phase cloned and torch.saved its snapshot (the CRC-32 and
    the clone cost more than the write), every digest copied the bytes first, every comparison
    hashed both sides again and the repeat arm wrote snapshots no one reads; 80-82 s after.
    """
    total, per_scenario, _, ok = _suite(["--fixture", fixture, "--world-sizes", "1"])
    print(f"\nfixture run of {fixture} (world size 1, N=3, K=3):")
    for name, seconds in per_scenario.items():
        print(f"{name:<26}{seconds:>8.2f}")
    print(f"1 GiB fixture run total: {total:.2f} s ({'pass' if ok else 'FAIL'})")
    print(f"1 GiB fixture run / import torch: {total / import_seconds:.1f} units")
    return ok


def _largest_child_rss_mib() -> float | None:
    """Peak RSS of the largest child process; Windows has no ``resource`` module."""
    if sys.platform == "win32":
        return None
    import resource

    kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    return kib / 1024


def _median_import(times: int) -> float:
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True, timeout=300)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def _suite(
    extra: list[str] | None = None,
    env: dict[str, str] | None = None,
    *,
    sample_memory: bool = False,
) -> tuple[float, dict[str, float], int, bool]:
    """Wall time of one ``run``; ``sample_memory`` also walks /proc every 50 ms for the tree's
    peak RSS, which costs about 2 s of CPU over a spawn-path run: only where it is printed."""
    with tempfile.TemporaryDirectory(prefix="dcp-invariant-bench-") as tmp:
        command = [
            sys.executable,
            "-m",
            "dcp_invariant",
            "run",
            "--output-dir",
            str(Path(tmp) / "evidence"),
            "--source-revision",
            "0" * 40,
            *(extra or []),
        ]
        started = time.perf_counter()
        proc = subprocess.Popen(
            command,
            # The verdict lines, each with its scenario's seconds, are on stdout (cli._Progress).
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        sampler = _TreeSampler(proc.pid)
        if sample_memory:
            sampler.start()
        try:
            stdout, stderr = proc.communicate(timeout=1800)
        finally:
            if sample_memory:
                sampler.stop()
        total = time.perf_counter() - started
    per_scenario = {m.group(2): float(m.group(3)) for m in _LINE.finditer(stdout)}
    if proc.returncode != 0:
        print(stderr, file=sys.stderr)
    return total, per_scenario, sampler.peak, proc.returncode == 0


class _TreeSampler(threading.Thread):
    """Sum of resident memory over a process and its descendants, sampled every 50 ms (Linux)."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.peak = 0
        self._done = threading.Event()

    def stop(self) -> None:
        self._done.set()
        self.join()

    def run(self) -> None:
        if not Path("/proc").is_dir():
            return
        while not self._done.wait(0.05):
            self.peak = max(self.peak, sum(_rss(pid) for pid in _tree(self.root)))


def _tree(root: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        tree += frontier
    return tree


def _rss(pid: int) -> int:
    # A process that exited between listing and reading holds no memory any more.
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _seal_benchmark(gib: float) -> None:
    sha256sum = shutil.which("sha256sum")
    with tempfile.TemporaryDirectory(prefix="dcp-invariant-seal-") as tmp:
        directory = Path(tmp) / "checkpoint"
        directory.mkdir()
        shards = 4
        per_shard = int(gib * 1024 * MIB) // shards
        block = os.urandom(8 * MIB)
        for i in range(shards):
            with open(directory / f"__{i}_0.distcp", "wb") as f:
                for _ in range(per_shard // len(block)):
                    f.write(block)
        (directory / ".metadata").write_bytes(os.urandom(4096))
        files = sorted(str(p) for p in directory.iterdir())
        # Warm the page cache once so both tools read from memory, then take the best of three.
        _best(lambda: receipt.seal(directory, "bench"), 1)
        seal = _best(lambda: receipt.seal(directory, "bench"), 3)
        sealed = receipt.seal(directory, "bench")
        check = _best(lambda: receipt.check(directory, sealed), 3)
        print(
            f"\nseal {gib:g} GiB ({shards} shards + .metadata): {seal:.2f} s; verify: {check:.2f} s"
        )
        if sha256sum is None:
            print("sha256sum not found: no ratio")
            return
        tool = _best(
            lambda: subprocess.run([sha256sum, *files], stdout=subprocess.DEVNULL, check=True), 3
        )
        print(f"sha256sum on the same files: {tool:.2f} s")
        print(f"seal / sha256sum: {seal / tool:.2f}; verify / sha256sum: {check / tool:.2f}")


def _best(call: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - started)
    return best


if __name__ == "__main__":
    sys.exit(main())
