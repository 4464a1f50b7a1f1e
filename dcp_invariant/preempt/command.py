"""``dcp-invariant preempt -- COMMAND``: the user's own job, killed at its own saves and
relaunched on what each kill left, judged against its uninterrupted run.

1. Three uninterrupted launches, all instrumented: the first lists every file operation, the
   crash points are chosen from that list, and the second and third (side by side) stop at
   each one and copy the run directory as it stands. The first two must agree (step lines,
   final state), or nothing can be judged: bad input. A point whose two copies differ is no
   single state of the job (:mod:`.states`): recorded, not judged.
2. Each SIGTERM point is a launch of its own, beside the second and third, signalled before
   its operation and killed once the grace period is over (:mod:`.recorder`); what it left is
   its crash state.
3. Each crash state is relaunched with the same command, in parallel where cores are free,
   and judged (:mod:`.verdict`).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from dcp_invariant import plan
from dcp_invariant.errors import PreemptInputError
from dcp_invariant.evidence.preempt import operations, record, step_lines, verdict
from dcp_invariant.evidence.preempt.operations import Identity, Operation, Point
from dcp_invariant.preempt import final_state, interposer, states
from dcp_invariant.preempt.launch import RUN_DIR, Launch, Launches

if TYPE_CHECKING:
    from dcp_invariant.preempt import relaunch_server
from dcp_invariant.preempt.recorder import Recorder

DEFAULT_CRASH_POINTS = plan.PREEMPT_CRASH_POINTS
DEFAULT_TIMEOUT = plan.PREEMPT_TIMEOUT
DEFAULT_SIGTERM_POINTS = plan.PREEMPT_SIGTERM_POINTS
DEFAULT_GRACE = plan.PREEMPT_GRACE


@dataclass(frozen=True)
class Options:
    command: tuple[str, ...]
    step_line: re.Pattern[str]
    final: str | None
    crash_points: int = DEFAULT_CRASH_POINTS
    timeout: float = DEFAULT_TIMEOUT
    output_dir: Path | None = None
    sigterm_points: int = DEFAULT_SIGTERM_POINTS
    grace: float = DEFAULT_GRACE


@dataclass(frozen=True)
class Outcome:
    """The checked job: its uninterrupted steps, its operations, each crash point's relaunch
    and reasons (empty: it passed), and the points whose state was not one state of the job."""

    reference: dict[int, list[str]]
    operations: list[Operation]
    relaunches: dict[Point, verdict.Relaunch]
    reasons: dict[Point, list[str]]
    varied: dict[Point, str]  # why each was not judged
    tails: dict[Point, list[str]]
    grace: float

    @functools.cached_property
    def _by_key(self) -> dict[tuple[str, int], tuple[int, Operation]]:
        """Each operation with its position, by key: built once, as reports ask per point."""
        return {operations.key(o): (i, o) for i, o in enumerate(self.operations)}

    def order(self, point: Point) -> tuple[int, int]:
        """Where ``point`` falls in the job's operations (a SIGKILL point first)."""
        return self._by_key[point[1:]][0], operations.HOWS.index(point[0])

    def described(self, point: Point) -> str:
        return operations.described(point[0], self._by_key[point[1:]][1], self.grace)


def checked_options(
    command: Sequence[str],
    step_line: str | None,
    final: str | None,
    crash_points: int,
    timeout: float,
    output_dir: Path | None = None,
    sigterm_points: int = DEFAULT_SIGTERM_POINTS,
    grace: float = DEFAULT_GRACE,
) -> Options:
    """The options, or :class:`PreemptInputError` naming the first problem: before any launch."""
    if not command:
        raise PreemptInputError(
            "give the job's command after --, e.g. -- python train.py --out {run_dir}"
        )
    if not any(RUN_DIR in arg for arg in command):
        raise PreemptInputError(
            f"the command has no {RUN_DIR}: put it where the job takes the directory it writes "
            f"its checkpoints to (e.g. --output-dir {RUN_DIR}); each launch gets a fresh one"
        )
    program = command[0]
    if shutil.which(program) is None:
        raise PreemptInputError(
            f"{program!r}: command not found: give a program on PATH or its path"
        )
    if final is not None:
        path = PurePosixPath(final)
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise PreemptInputError(
                f"--final {final!r} is not a path inside {RUN_DIR}: give it relative to the run "
                "directory, e.g. --final final.pt"
            )
    if crash_points < 1:
        raise PreemptInputError(f"--crash-points {crash_points}: give a positive number")
    if not 0 < timeout <= 86400:
        raise PreemptInputError(f"--timeout {timeout:g}: give seconds from 0 to 86400")
    if sigterm_points < 0:
        raise PreemptInputError(f"--sigterm-points {sigterm_points}: give 0 or more")
    if not 0 <= grace <= 3600:
        raise PreemptInputError(f"--grace {grace:g}: give seconds from 0 to 3600")
    regex = step_lines.compiled(step_line or step_lines.DEFAULT_STEP_LINE)
    if output_dir is not None and (
        output_dir.is_symlink()
        or (output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())))
    ):
        raise PreemptInputError(
            f"--output-dir {output_dir}: it exists and is not an empty directory: give a new one"
        )
    return Options(
        tuple(command), regex, final, crash_points, timeout, output_dir, sigterm_points, grace
    )


def evidence(options: Options, outcome: Outcome) -> dict[str, object]:
    """The canonical record of the check (:mod:`dcp_invariant.evidence.preempt.record`)."""
    return record.build(
        options.command,
        options.step_line.pattern,
        options.final,
        options.crash_points,
        options.timeout,
        options.sigterm_points,
        options.grace,
        outcome.reference,
        outcome.operations,
        outcome.relaunches,
        outcome.reasons,
        list(outcome.varied),
    )


def check(options: Options, launches: Launches) -> Outcome:
    """Run the whole check (the module's docstring says how)."""
    library = interposer.library()
    with tempfile.TemporaryDirectory(prefix="dcp-invariant-preempt-") as scratch:
        root = Path(scratch)
        starting = _ServerStart(options, root, library)
        try:
            first = _instrumented(options, launches, library, root / "launch-1", None, None)
            outcome = _from_the_first(options, launches, library, root, first, starting.get())
        finally:
            starting.close()
    return outcome


def _from_the_first(
    options: Options,
    launches: Launches,
    library: Path,
    root: Path,
    first: _Run,
    server: relaunch_server.Client | None,
) -> Outcome:
    """Everything after the first launch: the crash states, their relaunches, the verdicts."""
    points = operations.chosen(first.operations, options.crash_points)
    found = dict(zip(first.operations, operations.identities(first.operations), strict=True))
    chosen = {found[p]: p for p in points}
    terms = {found[p]: p for p in operations.terminated(first.operations, options.sigterm_points)}
    second, third, signalled, unjudged = _launched_together(
        options, launches, library, root, server, set(chosen), terms
    )
    _agree(options, first, second, forked=server is not None)
    crash_states, varied = _one_state_each(chosen, second.taken, third.taken)
    crash_states |= signalled
    varied |= unjudged
    spares = {operations.point("kill", chosen[k]): third.taken[k] for k in third.taken}
    spares |= {point: state.parent / SPARE for point, state in signalled.items()}
    relaunches, tails, flaky = _relaunch_all(options, launches, server, crash_states, spares, first)
    varied |= flaky
    if not relaunches:
        _nothing_judged(varied)
    reasons = verdict.judged(
        first.operations,
        relaunches,
        first.steps,
        options.timeout,
        options.grace,
        final_compared=options.final is not None,
    )
    return Outcome(first.steps, first.operations, relaunches, reasons, varied, tails, options.grace)


@dataclass
class _Run:
    run_dir: Path
    launch: Launch
    steps: dict[int, list[str]]
    operations: list[Operation]
    taken: dict[Identity, Path]


def _instrumented(
    options: Options,
    launches: Launches,
    library: Path,
    root: Path,
    server: relaunch_server.Client | None,
    chosen: set[Identity] | None,
) -> _Run:
    snapshots = root / "states"
    snapshots.mkdir(parents=True)
    run_dir, output = root / "run", root / "output.log"
    recorder = Recorder(root, run_dir, output, options.step_line, chosen, snapshots)
    done = _launched(options, launches, library, recorder, server)
    steps = step_lines.steps(done.lines, options.step_line)
    run = _Run(run_dir, done, steps, recorder.operations, recorder.taken)
    _usable(options, run)
    return run


def _launched(
    options: Options,
    launches: Launches,
    library: Path,
    recorder: Recorder,
    server: relaunch_server.Client | None,
) -> Launch:
    """One launch of the command under the interposer, heard by ``recorder``: forked by
    ``server`` where there is one (the interposer, preloaded there, starts reporting in the
    job), else a fresh one."""
    recorder.run_dir.mkdir(parents=True)
    recorder.output.touch()
    env = recorder.environment(library)
    started = lambda pid: setattr(recorder, "leader", pid)  # noqa: E731
    with recorder.serving():
        if server is not None:
            return launches.forked(
                server,
                options.command,
                recorder.run_dir,
                recorder.output,
                options.timeout,
                env,
                started,
            )
        return launches.run(
            options.command, recorder.run_dir, recorder.output, options.timeout, env, started
        )


def _launched_together(
    options: Options,
    launches: Launches,
    library: Path,
    root: Path,
    server: relaunch_server.Client | None,
    chosen: set[Identity],
    terms: dict[Identity, Operation],
) -> tuple[_Run, _Run, dict[Point, Path], dict[Point, str]]:
    """The second and third launches, which each take every chosen crash state (so that a state
    that differs between them is known, :mod:`.states`), and each SIGTERM point's launch, side
    by side where cores are free: the two runs, the states the signals left, and the SIGTERM
    points not judged, with why."""
    with ThreadPoolExecutor(max_workers=_cores()) as pool:
        try:
            # Names of one length: DCP's .metadata holds its checkpoint's path (storage_meta),
            # so paths of other lengths would give states of other sizes.
            runs = [
                pool.submit(_instrumented, options, launches, library, root / name, server, chosen)
                for name in ("launch-2", "launch-3")
            ]
            signals = [
                pool.submit(_signalled, options, launches, library, server, root / f"t{n:03d}", *it)
                for n, it in enumerate(terms.items())
            ]
            second, third = (run.result() for run in runs)
            results = [signal.result() for signal in signals]
        except BaseException:
            launches.stop_all()  # as in _relaunch_all: an interrupt kills the launches first
            raise
    states = {p: state for p, state, why in results if why is None}
    return second, third, states, {p: why for p, _, why in results if why is not None}


def _signalled(
    options: Options,
    launches: Launches,
    library: Path,
    server: relaunch_server.Client | None,
    at: Path,
    identity: Identity,
    operation: Operation,
) -> tuple[Point, Path, str | None]:
    """One SIGTERM point's launch: its point, the state it left, and why it is not judged
    (None: it is). A state to judge is copied beside it (``spare``), untouched for a second
    relaunch (:func:`_relaunch_all`), as the third launch's copies are for the SIGKILL points."""
    at.mkdir()
    recorder = Recorder(
        at,
        at / "run",
        at / "output.log",
        options.step_line,
        terminate=identity,
        grace=options.grace,
    )
    _launched(options, launches, library, recorder, server)
    why = None
    if not recorder.terminated:
        why = "the launch did not reach this operation alike, so it was never signalled"
    elif recorder.outlived_grace:
        why = (
            f"the job was still running {options.grace:g} s after SIGTERM, so where SIGKILL "
            "found it is chance (the SIGKILL points cover such states)"
        )
    else:
        shutil.copytree(recorder.run_dir, at / SPARE, symlinks=True)
    return operations.point("term", operation), recorder.run_dir, why


SPARE = "spare"


def _usable(options: Options, run: _Run) -> None:
    """An uninterrupted launch that can be a reference: it exits 0, prints step lines, writes."""
    last = run.launch.tail[-1] if run.launch.tail else "it printed nothing"
    if run.launch.exit_code is None:
        raise PreemptInputError(
            f"the job did not finish within --timeout {options.timeout:g} s without any crash: "
            "raise --timeout, or make the job shorter"
        )
    if run.launch.exit_code != 0:
        raise PreemptInputError(
            f"the job fails with no crash at all (exit code {run.launch.exit_code}; its last "
            f"line: {last[:200]}): make it run to the end first"
        )
    if not run.steps:
        raise PreemptInputError(
            f"no line of the job's output matches --step-line {options.step_line.pattern!r}: "
            "print one line a step, e.g. print(f'step {step} loss {loss.item().hex()}')"
        )
    if not any(run.run_dir.iterdir()):
        raise PreemptInputError(
            f"the job wrote nothing under {RUN_DIR}: pass it as the directory the job saves its "
            "checkpoints to"
        )
    if options.final is not None and not (run.run_dir / options.final).exists():
        raise PreemptInputError(
            f"--final {options.final}: the job left no such file or directory under {RUN_DIR}"
        )


def _agree(options: Options, first: _Run, second: _Run, forked: bool) -> None:
    """The first two uninterrupted launches agree, or nothing can be judged: bad input. The
    first is always a fresh interpreter; where the second was ``forked`` from the relaunch
    server, this also checks that a forked launch runs the job as a fresh one does."""
    differs = step_lines.first_difference(first.steps, second.steps)
    if differs is None and options.final is not None:
        differs = final_state.first_difference(
            first.run_dir / options.final, second.run_dir / options.final
        )
        differs = None if differs is None else f"the final state differs: {differs}"
    if differs is not None:
        raise PreemptInputError(
            f"two uninterrupted runs of the job differ ({differs}), so a resume cannot be "
            "judged: seed every generator, fix the thread count, use no data-loader workers or "
            "seed them, and use deterministic kernels (torch.use_deterministic_algorithms)"
            + (_FORKED if forked else "")
        )


_FORKED = (
    "; or, if the job depends on importing torch afresh (the second run was forked from a "
    "process that had imported it), start it with python -m or a launcher script, whose "
    "every launch is fresh"
)


def _one_state_each(
    chosen: dict[Identity, Operation],
    second: dict[Identity, Path],
    third: dict[Identity, Path],
) -> tuple[dict[Point, Path], dict[Point, str]]:
    """The chosen points both launches reached, with the state the second took, where both
    took one state (:mod:`.states`); and why each other point is not judged."""
    crash_states: dict[Point, Path] = {}
    varied: dict[Point, str] = {}
    for identity, operation in chosen.items():
        point = operations.point("kill", operation)
        missed = [w for w, taken in (("second", second), ("third", third)) if identity not in taken]
        differs = None if missed else states.first_difference(second[identity], third[identity])
        if missed:
            varied[point] = f"the {missed[0]} run did not make this operation"
        elif differs is not None:
            varied[point] = f"two runs left other states here ({differs})"
        else:
            crash_states[point] = second[identity]
    return crash_states, varied


def _nothing_judged(varied: dict[Point, str]) -> None:
    """Every point was skipped: a pass would say nothing, so it is bad input, with why."""
    why = next(iter(varied.values()), "the job made no operation that is a crash point")
    raise PreemptInputError(
        f"no crash point could be judged ({len(varied)} skipped; the first: {why}): make the "
        "job's saves repeat alike from run to run (the same files, written by the same process)"
    )


def _relaunch_all(
    options: Options,
    launches: Launches,
    server: relaunch_server.Client | None,
    taken: dict[Point, Path],
    spares: dict[Point, Path],
    first: _Run,
) -> tuple[dict[Point, verdict.Relaunch], dict[Point, list[str]], dict[Point, str]]:
    """Each crash state relaunched, in parallel where cores are free: the relaunches, their
    output to show, and the points not judged, with why. A relaunch that does not end as the
    uninterrupted run did is run again on an untouched copy of its state (``spares``: the
    third launch's), and a point whose two relaunches end otherwise is not judged: a job that
    fails now and then at its end (a thread torn down as the interpreter exits) would else
    read as a crash-loop."""

    def one(item: tuple[Point, Path]) -> tuple[Point, verdict.Relaunch, list[str], str | None]:
        point, state = item
        record, shown = _relaunched(options, launches, server, state, first.run_dir)
        spare = spares.get(point)
        if spare is None or not _differs(record, first.steps, options.final is not None):
            return point, record, shown, None
        again = state.with_name(f"{state.name}-again")
        shutil.copytree(spare, again, symlinks=True)
        other, _ = _relaunched(options, launches, server, again, first.run_dir)
        if other == record:
            return point, record, shown, None
        said = f"{_ended(record)}, then {_ended(other)}"
        return point, record, shown, f"two relaunches on this one state ended otherwise ({said})"

    with ThreadPoolExecutor(max_workers=max(1, min(len(taken), _cores()))) as pool:
        try:
            results = list(pool.map(one, sorted(taken.items(), key=lambda kv: str(kv[1]))))
        except BaseException:
            # An interrupt: the pool's exit waits for its threads, each waiting for its
            # launch, so the launches are killed first (the 2 s promise).
            launches.stop_all()
            raise
    judged = [(k, r, t) for k, r, t, why in results if why is None]
    flaky = {k: why for k, _, _, why in results if why is not None}
    return {k: r for k, r, _ in judged}, {k: t for k, _, t in judged}, flaky


def _relaunched(
    options: Options,
    launches: Launches,
    server: relaunch_server.Client | None,
    state: Path,
    reference_dir: Path,
) -> tuple[verdict.Relaunch, list[str]]:
    """One relaunch on ``state``: its record, and the output to show if it failed (its first
    error where its last lines miss it)."""
    log = state.parent / f"{state.name}.log"
    if server is not None:
        done = launches.forked(server, options.command, state, log, options.timeout)
    else:
        done = launches.run(options.command, state, log, options.timeout)
    final = None
    if options.final is not None and done.exit_code == 0:
        final = final_state.first_difference(reference_dir / options.final, state / options.final)
    steps = step_lines.steps(done.lines, options.step_line)
    record: verdict.Relaunch = {"exit_code": done.exit_code, "steps": steps, "final": final}
    error = done.first_error
    shown = done.tail
    if error is not None and error not in done.tail[-_SHOWN:]:
        shown = [error, "...", *done.tail]
    return record, shown


def _differs(
    relaunch: verdict.Relaunch, reference: dict[int, list[str]], final_compared: bool
) -> bool:
    """The relaunch did not end as the uninterrupted run did: an exit code, a step or the final
    state (a step past the end counts as the verdict counts it, :func:`.verdict.judged`)."""
    steps = relaunch["steps"]
    return (
        relaunch["exit_code"] != 0
        or relaunch["final"] is not None
        or step_lines.first_difference(reference, steps, not final_compared) is not None
    )


def _ended(relaunch: verdict.Relaunch) -> str:
    code = relaunch["exit_code"]
    if code is None:
        return "timed out"
    first = f"from step {min(relaunch['steps'])}" if relaunch["steps"] else "with no step"
    return f"exit code {code}, {first}" + (", another final state" if relaunch["final"] else "")


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


class _ServerStart:
    """The relaunch server, started beside the first launch (its imports take about as long as
    the launch does) and waited for once the launches after it need it."""

    def __init__(self, options: Options, root: Path, library: Path) -> None:
        self._client = _server_for(options, root, library)

    def get(self) -> relaunch_server.Client | None:
        if self._client is not None:
            try:
                self._client.ready()
            except (OSError, RuntimeError, TimeoutError):
                self._client = None  # fresh interpreters instead, as slower as faithful
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def _server_for(options: Options, root: Path, library: Path) -> relaunch_server.Client | None:
    """A server that forks each launch after the first, for a ``python script.py ...``
    command, with the interposer preloaded (inactive until a job's environment names its
    socket); None for any other command (``torchrun``, ``python -m``, a launcher script),
    which is launched afresh."""
    program = shutil.which(options.command[0])
    script = options.command[1] if len(options.command) > 1 else ""
    if (
        program is None
        or not Path(program).name.startswith("python")
        or script.startswith("-")
        or not Path(script).is_file()
    ):
        return None
    from dcp_invariant.preempt import relaunch_server

    preload = f"{library} {os.environ.get('LD_PRELOAD', '')}".strip()
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", "LD_PRELOAD": preload}
    try:
        return relaunch_server.Client(program, environment, str(root), options.timeout)
    except OSError:
        return None  # the launches start fresh interpreters instead, as slower as faithful


def report(outcome: Outcome) -> tuple[list[str], int]:
    """The verdicts grouped by cause, each cause once with the points it was seen at and the
    first relaunch's last lines; the points that passed in one line; and the exit code."""
    ops = outcome.operations
    lines = [
        f"preempt: {len(ops)} file operations (ranks {', '.join(sorted({o.rank for o in ops}))}), "
        f"{len(outcome.relaunches)} crash points relaunched; the uninterrupted run reached "
        f"step {max(outcome.reference)}"
    ]
    by_cause: dict[str, list[tuple[Point, str]]] = {}
    passed: list[Point] = []
    for point, reasons in outcome.reasons.items():  # in the order the job made them
        if not reasons:
            passed.append(point)
        for reason in reasons:
            cause, _, rest = reason.partition(": ")
            by_cause.setdefault(cause, []).append((point, rest))
    for cause, seen in by_cause.items():
        at = len({point for point, _ in seen})
        lines.append(f"FAIL  {cause}: at {at} of {len(outcome.reasons)} crash points")
        lines += [f"      - {rest}" for _, rest in seen]
        first = seen[0][0]
        if outcome.relaunches[first]["exit_code"] != 0:
            lines += _relaunch_output(outcome.tails.get(first, []))
    if passed:
        named = "; ".join(outcome.described(p) for p in passed)
        lines.append(f"ok    {len(passed)} crash points: {named}")
    lines += [
        f"skip  {outcome.described(p)}: {outcome.varied[p]}"
        for p in sorted(outcome.varied, key=outcome.order)
    ]
    failed = len(outcome.reasons) - len(passed)
    lines.append(f"summary: {len(passed)} passed, {failed} failed")
    return lines, 1 if failed else 0


# A failed relaunch's last lines in the report.
_SHOWN = 5


def _relaunch_output(tail: list[str]) -> list[str]:
    """A failed relaunch's output: the first exception it named, where that is not among its
    last lines (a launcher's summary can end them), then its last lines."""
    error_first = tail[1:2] == ["..."]
    shown = tail[:2] + tail[-_SHOWN:] if error_first else tail[-_SHOWN:]
    what = "first error and last lines" if error_first else "last lines"
    return [f"      the first relaunch's {what}:", *(f"      | {line[:200]}" for line in shown)]
