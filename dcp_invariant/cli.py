"""``dcp-invariant``: run the suite, verify an artifact, list the scenarios.

Exit codes: 0 success, 1 an invariant failed or an artifact is invalid (with every reason),
2 bad input (one line naming the problem and the fix; nothing written).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

from dcp_invariant import __version__, canonical, plan, runtimes
from dcp_invariant.evidence import schema

if TYPE_CHECKING:
    from dcp_invariant.python_api import Report
    from dcp_invariant.suite.runner import Finished

from dcp_invariant.errors import EXIT_FAIL, EXIT_OK, BadInput, UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse exits 2 too; keep the one-line form
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dcp-invariant",
        description="Prove that PyTorch DCP resumes are exact and damaged checkpoints are never loaded.",
    )
    parser.add_argument("--version", action="version", version=f"dcp-invariant {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="after a one-line error, also print the traceback that led to it; with run, "
        "show every worker log line of a failure (no cap)",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_run(sub)
    _add_verify(sub)
    _add_inspect(sub)
    sub.add_parser("list", help="list the scenarios")
    _add_in_job(sub)
    _add_preempt(sub)
    _add_github_report(sub)
    _add_action_inputs(sub)
    return parser


# What add_subparsers returns (typeshed names the class; argparse documents only its use).
Subparsers: TypeAlias = "argparse._SubParsersAction[_Parser]"


def _add_loop_options(command: argparse.ArgumentParser, *, fixture_required: bool) -> None:
    """What ``run --fixture`` and ``in-job`` both take: the loop, its steps and arguments, and
    the revision under test. Each means the same in both; ``--timeout`` does not, and each
    command declares its own."""
    given = "" if fixture_required else "with --fixture: "
    command.add_argument(
        "--fixture",
        required=fixture_required,
        metavar="MODULE:CALLABLE",
        help=("" if fixture_required else "check your own training loop: ")
        + "CALLABLE(rank, world_size) returns an app with step() -> float and either "
        "state_dict() and load_state_dict(sd) (checkpointed through DCP) or save(dir) and "
        "load(dir) (it checkpoints itself; with state_dict() too, what it loaded is compared); "
        "docs/fixtures.md (the current directory is importable)",
    )
    command.add_argument(
        "--steps-before",
        type=int,
        default=None,
        help=f"{given}steps before the save (default {plan.DEFAULT_STEPS_BEFORE})",
    )
    command.add_argument(
        "--steps-after",
        type=int,
        default=None,
        help=f"{given}steps compared after the resume (default {plan.DEFAULT_STEPS_AFTER})",
    )
    command.add_argument(
        "--fixture-arg",
        action="append",
        default=None,
        metavar="NAME=VALUE",
        help=f"{given}a keyword argument for CALLABLE, VALUE as JSON without floats "
        "(width=64, name='\"tiny\"'; a VALUE that is not JSON is taken as a string); repeatable",
    )
    command.add_argument(
        "--ignore-attr",
        action="append",
        default=None,
        metavar="PATH",
        help=f"{given}an attribute of your app's objects that does not matter to a resume, as a "
        "reason names it (app.ema, app.timer, rng.numpy): left out of what is compared; "
        "repeatable",
    )
    command.add_argument(
        "--source-revision",
        help="40-hex revision of the code under test (default: $GITHUB_SHA, else git rev-parse HEAD)",
    )


def _add_run(sub: Subparsers) -> None:
    run = sub.add_parser(
        "run",
        help="run the registered scenarios, or your fixture's, and write an evidence artifact",
    )
    run.add_argument(
        "--output-dir",
        required=True,
        type=Path,
        help="artifact directory (must not exist, or be an empty directory)",
    )
    _add_loop_options(run, fixture_required=False)
    run.add_argument(
        "--world-sizes",
        default=None,
        help=f"with --fixture: distinct world sizes up to {plan.MAX_WORLD_SIZE} "
        f"(default {','.join(map(str, plan.DEFAULT_WORLD_SIZES))})",
    )
    run.add_argument(
        "--rank-local",
        action="append",
        default=None,
        metavar="COMPONENT",
        help="with --fixture: a top-level key of state_dict() that each rank keeps for itself "
        "(a data loader keyed by rank): reshard scenarios leave it out, resumes still check "
        "it; repeatable",
    )
    run.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds each group of worker processes may take (default {plan.DEFAULT_TIMEOUT:g})",
    )
    run.add_argument(
        "--resume-with-torch",
        action="append",
        default=None,
        metavar="RELEASE",
        help="with --fixture: also resume each save with fresh ranks running this registered "
        "torch release (upgrade_/downgrade_ scenarios), in an environment uv makes and caches; "
        "repeatable",
    )
    run.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        # The variable's home is dcp_invariant/other_release.py, which verify must not import.
        help="where --resume-with-torch keeps the other releases' environments (default "
        "$DCP_INVARIANT_CACHE_DIR, else your user cache directory)",
    )


def _add_verify(sub: Subparsers) -> None:
    verify = sub.add_parser("verify", help="verify an artifact offline (imports no torch)")
    verify.add_argument("directory", nargs="?", type=Path, help="artifact directory")
    verify.add_argument(
        "--artifact-dir", type=Path, help="artifact directory (same as the positional)"
    )
    verify.add_argument(
        "--verbose",
        action="store_true",
        help="list every problem even of a directory that is not an artifact at all",
    )


def _add_inspect(sub: Subparsers) -> None:
    inspect = sub.add_parser(
        "inspect",
        help="check a DCP checkpoint directory against its .metadata (imports no torch, "
        "never runs the pickle)",
    )
    inspect.add_argument("directory", type=Path, help="the directory dcp.save wrote")
    inspect.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="also estimate what each rank would read when loading at this world size",
    )
    inspect.add_argument("--json", action="store_true", help="print one canonical JSON record")


def _add_preempt(sub: Subparsers) -> None:
    preempt = sub.add_parser(
        "preempt",
        help="kill your own training command at every point of its saves, relaunch it, and "
        "judge its own auto-resume (Linux)",
        usage="dcp-invariant preempt [OPTIONS] -- COMMAND [ARGS...] (with {run_dir} in it)",
    )
    preempt.add_argument(
        "--step-line",
        metavar="REGEX",
        help="picks the per-step lines out of the job's output, with named groups step and "
        "loss (default: `step 3 loss 0.25` and torchtitan's `step: 3 loss: 0.25`)",
    )
    preempt.add_argument(
        "--final",
        metavar="PATH",
        help="what the job leaves at its end, relative to {run_dir}: compared bit for bit",
    )
    preempt.add_argument(
        "--crash-points",
        type=int,
        default=plan.PREEMPT_CRASH_POINTS,
        metavar="N",
        help=f"crash points to relaunch (default {plan.PREEMPT_CRASH_POINTS}; every rename, "
        "unlink and rmdir, and the state between saves, always)",
    )
    preempt.add_argument(
        "--timeout",
        type=float,
        default=plan.PREEMPT_TIMEOUT,
        metavar="SECONDS",
        help=f"seconds each launch may take (default {plan.PREEMPT_TIMEOUT:g})",
    )
    preempt.add_argument(
        "--sigterm-points",
        type=int,
        default=plan.PREEMPT_SIGTERM_POINTS,
        metavar="N",
        help=f"points where the job gets SIGTERM, then SIGKILL after --grace, each a launch of "
        f"its own (default {plan.PREEMPT_SIGTERM_POINTS}; 0: none)",
    )
    preempt.add_argument(
        "--grace",
        type=float,
        default=plan.PREEMPT_GRACE,
        metavar="SECONDS",
        help=f"seconds between SIGTERM and SIGKILL (default {plan.PREEMPT_GRACE:g}, as Kubernetes)",
    )
    preempt.add_argument(
        "--output-dir",
        type=Path,
        help="where the evidence (preempt.json) goes: a new or empty directory; "
        "`dcp-invariant verify DIR` derives every verdict again from it",
    )
    preempt.add_argument("job", nargs=argparse.REMAINDER, help="-- then the job's command")


def _preempt(args: argparse.Namespace) -> int:
    from dcp_invariant.preempt import command
    from dcp_invariant.preempt.launch import Launches

    job = args.job[1:] if args.job[:1] == ["--"] else args.job
    options = command.checked_options(
        job,
        args.step_line,
        args.final,
        args.crash_points,
        args.timeout,
        args.output_dir,
        args.sigterm_points,
        args.grace,
    )
    launches = Launches()
    try:
        with _interruptible():
            try:
                outcome = command.check(options, launches)
            finally:
                launches.stop_all()
    except Interrupted as exc:
        print("dcp-invariant: interrupted: nothing written", file=sys.stderr)
        return 128 + exc.signum
    lines, code = command.report(outcome)
    if options.output_dir is not None:
        from dcp_invariant.evidence.preempt import record

        record.write(options.output_dir, command.evidence(options, outcome))
        lines.append(f"evidence: {options.output_dir / record.PREEMPT_FILE}")
    _print_lines(lines)
    return code


def _add_in_job(sub: Subparsers) -> None:
    in_job = sub.add_parser(
        "in-job",
        help="as a worker of your torchrun job (torchrun --max-restarts=1 ... -m dcp_invariant "
        "in-job ...): check your loop at the job's world size, across its nodes",
    )
    in_job.add_argument(
        "--checkpoint-dir",
        required=True,
        type=Path,
        help="a fresh directory every node sees (a shared filesystem): checkpoints and records",
    )
    in_job.add_argument(
        "--output-dir", required=True, type=Path, help="where rank 0 writes the artifact"
    )
    _add_loop_options(in_job, fixture_required=True)
    in_job.add_argument(
        "--backend",
        choices=plan.BACKENDS,
        default="gloo",
        help="the process group's backend (default gloo); nccl puts each rank on GPU LOCAL_RANK",
    )
    in_job.add_argument(
        "--gloo-interface",
        metavar="IFNAME",
        help="the network interface Gloo binds (sets GLOO_SOCKET_IFNAME), e.g. eth0",
    )
    # Each rank is a process of the user's job, which nothing here starts or bounds as a whole:
    # what can hang is a collective waiting for another rank.
    in_job.add_argument(
        "--timeout",
        type=float,
        default=None,
        help=f"seconds each collective between the job's ranks may take (default {plan.DEFAULT_TIMEOUT:g})",
    )
    in_job.add_argument(
        "--resume-from",
        type=Path,
        metavar="DIR",
        help="a second launch at another node count: the first launch's --checkpoint-dir, "
        "whose checkpoint this one loads and steps on from (launch with --max-restarts=0)",
    )


def _add_github_report(sub: Subparsers) -> None:
    report = sub.add_parser(
        "github-report",
        help="write the GitHub job summary and step outputs for an artifact (always exits 0)",
    )
    report.add_argument("--artifact-dir", required=True, type=Path, help="artifact directory")
    report.add_argument(
        "--artifact-name", default="", help="name for the upload (default: unique per matrix job)"
    )
    report.add_argument("--torch-version", default="", help="requested torch, for the default name")
    report.add_argument(
        "--use",
        type=int,
        default=1,
        help="which use of the action in the job this is, for the default name (default: 1)",
    )
    report.add_argument(
        "--summary-file",
        type=Path,
        default=_env_path("GITHUB_STEP_SUMMARY"),
        help="Markdown summary is appended here (default: $GITHUB_STEP_SUMMARY, else stdout)",
    )
    _add_output_file(report)


def _add_action_inputs(sub: Subparsers) -> None:
    command = sub.add_parser(
        "action-inputs",
        help="check the composite action's inputs (from DCPI_<INPUT> variables) before anything "
        "is installed; write run's (or preempt's) arguments and the normalised values",
    )
    command.add_argument(
        "--arguments-file",
        required=True,
        type=Path,
        help="where run's (or preempt's) arguments are written, one a line",
    )
    _add_output_file(command)


def _add_output_file(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--output-file",
        type=Path,
        default=_env_path("GITHUB_OUTPUT"),
        help="key=value outputs are appended here (default: $GITHUB_OUTPUT, else stdout)",
    )


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value) if value else None


def main(argv: list[str] | None = None) -> int:
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    try:
        try:
            args = build_parser().parse_args(argv)
        except KeyboardInterrupt:  # no command has begun: nothing is written
            print("dcp-invariant: interrupted: nothing written", file=sys.stderr)
            return 128 + signal.SIGINT
        commands = {
            "run": _run,
            "verify": _verify,
            "inspect": _inspect,
            "list": _list,
            "github-report": _github_report,
            "action-inputs": _action_inputs,
            "in-job": _in_job,
            "preempt": _preempt,
        }
        return commands[args.command](args)
    except BadInput as exc:
        print(f"dcp-invariant: error: {exc}", file=sys.stderr)
        if debug:
            if exc.details:
                print(exc.details, file=sys.stderr)
            traceback.print_exception(exc, file=sys.stderr)
        return exc.exit_code


def _in_job(args: argparse.Namespace) -> int:
    from dcp_invariant import python_api
    from dcp_invariant.suite.torchrun import in_job

    options = in_job.Options(
        fixture=args.fixture,
        checkpoint_dir=args.checkpoint_dir,
        output_dir=args.output_dir,
        steps_before=plan.DEFAULT_STEPS_BEFORE if args.steps_before is None else args.steps_before,
        steps_after=plan.DEFAULT_STEPS_AFTER if args.steps_after is None else args.steps_after,
        fixture_args=_fixture_args(args.fixture_arg or []),
        backend=args.backend,
        gloo_interface=args.gloo_interface,
        timeout=python_api.checked_timeout(args.timeout, "--timeout"),
        source_revision=_revision(args, announce=os.environ.get("RANK", "0") == "0"),
        resume_from=args.resume_from,
        ignored_attrs=tuple(args.ignore_attr or ()),
    )
    # As `run` does: the fixture's module is found from the directory the job starts in.
    sys.path.insert(0, os.getcwd())
    return in_job.main(options)


def _list(args: argparse.Namespace) -> int:
    width = max(len(n) for n in plan.SCENARIO_NAMES)
    for scenario in plan.SCENARIOS:
        print(f"{scenario.name:<{width}}  {scenario.summary}")
    return EXIT_OK


def _verify(args: argparse.Namespace) -> int:
    from dcp_invariant.evidence import rules
    from dcp_invariant.evidence.verify import verify_artifact

    if (
        args.directory is not None
        and args.artifact_dir is not None
        and args.directory != args.artifact_dir
    ):
        raise UsageError("give the artifact directory once: positionally or with --artifact-dir")
    directory = args.directory or args.artifact_dir
    if directory is None:
        raise UsageError("no artifact directory: dcp-invariant verify DIR")
    try:
        is_dir = directory.is_dir()
    except (OSError, ValueError):  # a name too long for the OS, say
        is_dir = False
    if not is_dir:
        raise UsageError(
            f"{canonical.shown(str(directory))} is not a directory: pass the directory "
            "`dcp-invariant run` wrote"
        )
    if (directory / "preempt.json").is_file():
        from dcp_invariant.evidence.preempt import record

        valid, said = record.verify(directory)
        _print_lines(said)
        return EXIT_OK if valid and said[-1].startswith("pass") else EXIT_FAIL
    report = verify_artifact(directory)
    lines = []
    if not report.artifact_like:
        # A repository root or an empty directory: one line says what it is.
        lines.append(f"not a dcp-invariant artifact: no {schema.MANIFEST_FILE}")
    if report.artifact_like or args.verbose:
        for name in report.run_plan.names:
            result = report.results.get(name)
            if result is None:
                lines.append(f"INVALID  {name}")
                continue
            lines.append(f"{result['verdict'].upper():<7}  {name}")
            lines += [f"         - {canonical.shown(reason)}" for reason in result["reasons"]]
        lines += [f"invalid: {canonical.shown(problem)}" for problem in report.problems]
        if not report.valid:
            lines.append(f"verdict: invalid artifact ({len(report.problems)} problems)")
        else:
            # What the run did not check, as `run` said it: the plan is the recorded one.
            lines += [f"note: {canonical.shown(note)}" for note in report.run_plan.notes]
            failed = sum(r["verdict"] == "fail" for r in report.results.values())
            passed = len(report.results) - failed
            lines.append(rules.verdict_line("fail" if failed else "pass", passed, failed))
    _print_lines(lines)
    return EXIT_OK if report.passed else EXIT_FAIL


def _inspect(args: argparse.Namespace) -> int:
    from dcp_invariant.inspection import checkpoint

    world_size = args.world_size
    if world_size is not None:
        world_size = checkpoint.checked_world_size(world_size)
    report = checkpoint.inspect_checkpoint(args.directory, world_size=world_size)
    if args.json:
        _print_lines([canonical.dumps(report.to_record()).decode("utf-8")], end="")
    else:
        _print_lines(report.lines())
    return EXIT_OK if report.sound else EXIT_FAIL


def _github_report(args: argparse.Namespace) -> int:
    from dcp_invariant import github

    name = github.artifact_name(args.artifact_name, args.torch_version, os.environ, args.use)
    # Everything is built before anything is written: all outputs reach the files, or none.
    report = github.report_for(args.artifact_dir)
    markdown = github.summary(args.artifact_dir, report)
    values = {**github.outputs(args.artifact_dir, report), "artifact-name": name}
    rendered = github.render_outputs(values)
    try:
        if args.output_file is None:
            _print_lines([rendered], end="")
        else:
            github.append(args.output_file, rendered)
        if args.summary_file is None:
            _print_lines([markdown], end="")
        else:
            github.append(args.summary_file, markdown)
    except OSError as exc:
        print(f"dcp-invariant: error: cannot write the report: {exc}", file=sys.stderr)
    # The gate step decides pass or fail; this step must not stop the upload before it.
    return EXIT_OK


def _action_inputs(args: argparse.Namespace) -> int:
    from dcp_invariant import action_inputs, github

    inputs = {
        name: os.environ.get("DCPI_" + name.upper().replace("-", "_"), "")
        for name in action_inputs.NAMES
    }
    checked = action_inputs.check(inputs, run_plan_of)
    # One argument a line: none holds a line break (action_inputs checks the free-form ones).
    lines = "".join(f"{argument}\n" for argument in checked.arguments)
    try:
        with open(args.arguments_file, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(lines)
        rendered = github.render_outputs(checked.outputs())
        if args.output_file is None:
            _print_lines([rendered], end="")
        else:
            github.append(args.output_file, rendered)
    except OSError as exc:
        raise UsageError(f"cannot write the checked inputs: {exc}") from None
    return EXIT_OK


def run_plan_of(argv: list[str], installed_release: str | None = None) -> plan.Plan:
    """The plan ``run`` would make of ``argv`` (``["run", ...]``), or its one-line BadInput;
    ``installed_release``: the torch it will run on, where that is not installed yet."""
    args = build_parser().parse_args(argv)
    if args.command != "run":
        raise UsageError(f"expected run's arguments, got {args.command}")
    return _run_plan(args, installed_release)


def _print_lines(lines: list[str], end: str = "\n") -> None:
    """Print to stdout in the terminal's encoding, and stop quietly when the reader has gone
    (``verify DIR | head -1``), as https://docs.python.org/3/library/signal.html#note-on-sigpipe
    recommends: stdout is pointed at devnull so the interpreter's final flush is silent too."""
    text = "".join(line + end for line in lines)
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    text = text.encode(encoding, "backslashreplace").decode(encoding, "replace")
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError, AttributeError):
            pass  # not a real file descriptor: nothing left to flush at exit


def _revision(args: argparse.Namespace, *, announce: bool) -> str:
    """The revision under test; where none can be found, a note says it is recorded as unknown
    (``announce``: in a job, rank 0 alone says so)."""
    from dcp_invariant import python_api
    from dcp_invariant.evidence.provenance import UNKNOWN_REVISION

    revision = python_api.source_revision_of(args.source_revision, "--source-revision")
    if revision == UNKNOWN_REVISION and announce:
        print(
            "dcp-invariant: note: no --source-revision, no $GITHUB_SHA and no git checkout here: "
            f"provenance.json records the revision as {UNKNOWN_REVISION!r}",
            file=sys.stderr,
        )
    return revision


def _run(args: argparse.Namespace) -> int:
    # From the start, not only around the scenarios: a Ctrl-C while the plan is read or git
    # asked for the revision is one line too, not a KeyboardInterrupt traceback.
    try:
        with _interruptible():
            report, progress = _run_report(args)
    except Interrupted as exc:
        print("dcp-invariant: interrupted: nothing written", file=sys.stderr)
        return 128 + exc.signum
    if report.artifact is None:  # the fixture's first step timed out: no scenario ran
        for diagnosis in report.diagnoses:
            for reason in diagnosis.reasons:
                print(f"dcp-invariant: fail: {reason}", file=sys.stderr)
        return EXIT_FAIL
    # Scenarios are also judged against each other once all have run (rules.consistency): what
    # that adds is printed before the verdict, so the console never says less than the artifact.
    later = []
    for result in report.results.values():
        added = [r for r in result.reasons if r not in progress.printed.get(result.name, [])]
        if added:
            later.append(f"fail  {result.name:<24} compared with the other scenarios")
            later += [f"      - {reason}" for reason in added]
    notes = [f"note: {note}" for note in report.notes]
    _print_lines([*later, *notes, report.summary])
    return EXIT_OK if report.passed else EXIT_FAIL


def _run_report(args: argparse.Namespace) -> tuple[Report, _Progress]:
    from dcp_invariant import python_api

    progress = _Progress(debug=args.debug)
    run_plan = _run_plan(args)
    timeout = python_api.checked_timeout(args.timeout, "--timeout")
    try:
        cwd = os.getcwd()
    except FileNotFoundError:
        raise UsageError(
            "the current directory no longer exists: cd into an existing directory"
        ) from None
    revision = _revision(args, announce=True)
    if run_plan.kind == "fixture":
        # As uvicorn and gunicorn do for MODULE:ATTR: the fixture's module is found from here.
        sys.path.insert(0, cwd)
    report = python_api.run_plan(
        run_plan,
        args.output_dir,
        timeout=timeout,
        revision=revision,
        on_finish=progress,
        cache_dir=args.cache_dir,
    )
    return report, progress


class _Progress:
    """Prints each scenario as it finishes: verdicts to stdout, the workers' logs to stderr, as
    test runners print them (`> verdicts.txt` keeps the one; a terminal shows both in order, as
    stdout is flushed first)."""

    def __init__(self, *, debug: bool) -> None:
        from dcp_invariant.suite import console

        self.shown = console.ShownLogs(cap=None if debug else console.CAP)
        self.printed: dict[str, list[str]] = {}  # each scenario's reasons as its line showed them

    def __call__(self, done: Finished) -> None:
        self.printed[done.name] = done.reasons
        lines = [f"{done.verdict:<4}  {done.name:<24} {done.seconds:6.1f} s"]
        lines += [f"      - {reason}" for reason in done.reasons]
        lines += [f"      warning: {warning}" for warning in done.warnings]
        _print_lines(lines)
        excerpt = self.shown.excerpt(done.logs)
        if excerpt:
            print("\n".join(f"      {line}" for line in excerpt), file=sys.stderr, flush=True)


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived: everything stops, nothing is written."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signum)


@contextlib.contextmanager
def _interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM (a CI runner's cancel) raise :class:`Interrupted` once.

    A second signal during the cleanup that follows is ignored: the cleanup kills every worker
    and removes the workspace within seconds, and must not be cut short itself.
    """
    wanted = [signal.SIGINT, signal.SIGTERM]

    def interrupt(signum: int, frame: object) -> None:
        for s in wanted:
            signal.signal(s, signal.SIG_IGN)
        raise Interrupted(signum)

    saved = {s: signal.signal(s, interrupt) for s in wanted}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def _run_plan(args: argparse.Namespace, installed_release: str | None = None) -> plan.Plan:
    if getattr(args, "cache_dir", None) is not None and not args.resume_with_torch:
        # Nothing else reads it: a run that would ignore it is more likely a forgotten flag.
        raise UsageError(
            "--cache-dir goes with --resume-with-torch RELEASE (it holds the other releases' "
            "environments): add that, or drop --cache-dir"
        )
    if args.fixture is None:
        given = [
            flag
            for flag, value in (
                ("--world-sizes", args.world_sizes),
                ("--steps-before", args.steps_before),
                ("--steps-after", args.steps_after),
                ("--fixture-arg", args.fixture_arg),
                ("--rank-local", args.rank_local),
                ("--ignore-attr", args.ignore_attr),
                ("--resume-with-torch", args.resume_with_torch),
            )
            if value is not None
        ]
        if given:
            raise UsageError(f"{', '.join(given)} go with --fixture MODULE:CALLABLE")
        return plan.REGISTERED
    sizes: tuple[int, ...] = plan.DEFAULT_WORLD_SIZES
    if args.world_sizes is not None:
        try:
            sizes = tuple(int(w) for w in args.world_sizes.split(","))
        except ValueError:
            raise UsageError(
                f"--world-sizes {args.world_sizes!r}: give comma-separated integers, e.g. 1,2"
            ) from None
    return plan.fixture_plan(
        args.fixture,
        sizes,
        plan.DEFAULT_STEPS_BEFORE if args.steps_before is None else args.steps_before,
        plan.DEFAULT_STEPS_AFTER if args.steps_after is None else args.steps_after,
        _fixture_args(args.fixture_arg or []),
        args.rank_local or (),
        ignored_attrs=args.ignore_attr or (),
        resume_with_torch=args.resume_with_torch or (),
        torch_release=(installed_release or runtimes.installed_release())
        if args.resume_with_torch
        else "",
    )


def _fixture_args(given: list[str]) -> dict[str, Any]:
    """``NAME=VALUE`` pairs; VALUE is JSON (``64``, ``true``, ``[1, 2]``), else a string."""
    arguments: dict[str, Any] = {}
    for pair in given:
        name, sep, text = pair.partition("=")
        if not sep or not name:
            raise UsageError(f"--fixture-arg {pair!r}: expected NAME=VALUE, e.g. width=64")
        if name in arguments:
            raise UsageError(f"--fixture-arg {name}: given twice; give each name once")
        try:
            arguments[name] = json.loads(text)
        except json.JSONDecodeError:
            arguments[name] = text  # a bare word: what the shell left of a quoted string
        except RecursionError:
            raise UsageError(f"--fixture-arg {name}: the value is nested too deeply") from None
        except ValueError:
            # Not a decoding error (caught above): CPython refuses to convert an integer of
            # more digits than sys.get_int_max_str_digits() (4300 by default) from text.
            raise UsageError(
                f"--fixture-arg {name}: the value holds an integer of more digits than Python "
                f"reads ({sys.get_int_max_str_digits()}); fixture arguments take integers of at "
                f"most {canonical.MAX_INT_DIGITS} digits: pass a longer number as a string"
            ) from None
    return arguments


if __name__ == "__main__":
    sys.exit(main())
