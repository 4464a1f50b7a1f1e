"""The composite action's inputs (``action.yml``), checked in one step before anything is
installed, and turned into what the later steps use.

Run with the Python the action's environment is made from, from the action's own checkout
(``dcp-invariant action-inputs``), so a typo costs seconds, not a torch install and a suite.
Each bad value is one line that names the input (:class:`ActionInputError`, exit 2). The
suite's own inputs are held to ``run``'s grammar by ``run``'s parser: one input at a time,
so the line names the input at fault, then all together, as the suite step will pass them.

With ``preempt-command`` the action runs ``dcp-invariant preempt`` on the caller's own command
instead of the suite: the command is split here as a shell would split it (``shlex.split``),
each argument one line of the arguments file, and no shell ever sees it.

GitHub reads a boolean input in ``if:`` case-insensitively (``'True' == 'true'``), and a shell
step compares it as it is: the booleans, and ``environment``, are given back lower-case for the
later steps to use, so ``run-suite: "True"`` runs the suite instead of skipping its install.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from dcp_invariant import runtimes
from dcp_invariant.errors import ActionInputError, BadInput
from dcp_invariant.evidence.provenance import valid_revision

Environment = Literal["action", "caller"]
BOOLEANS = ("upload", "run-suite", "attest")
# The inputs `run` takes, and the flag each becomes; a list input is one flag per item.
_LOOP_INPUTS = (
    "world-sizes",
    "steps-before",
    "steps-after",
    "fixture-args",
    "rank-local",
    "ignore-attr",
    "resume-with-torch",
)
# preempt's options, each with preempt-command only; the flag each becomes.
_PREEMPT_OPTIONS = {
    "preempt-final": "--final",
    "preempt-step-line": "--step-line",
    "preempt-crash-points": "--crash-points",
}


@dataclass(frozen=True)
class Checked:
    environment: Environment
    run_suite: bool  # the check step runs: the suite (a fixture's too), or preempt
    upload: bool
    attest: bool
    # `dcp-invariant run`'s arguments, each one argument (never split or evaluated again).
    run_arguments: tuple[str, ...]
    preempt: bool = False  # the check step runs preempt instead of the suite
    # `dcp-invariant preempt`'s arguments, the job's command last, after "--".
    preempt_arguments: tuple[str, ...] = ()

    @property
    def arguments(self) -> tuple[str, ...]:
        """The check step's arguments, one a line of the arguments file: preempt's or run's."""
        return self.preempt_arguments if self.preempt else self.run_arguments

    def outputs(self) -> dict[str, str]:
        """What the later steps read: the normalised values, as GitHub step outputs."""
        from dcp_invariant.evidence import schema
        from dcp_invariant.evidence.preempt.record import PREEMPT_FILE

        return {
            "environment": self.environment,
            "run-suite": _text(self.run_suite),
            "preempt": _text(self.preempt),
            "upload": _text(self.upload),
            "attest": _text(self.attest),
            # What attest attests: the file that names all the evidence.
            "evidence-file": PREEMPT_FILE if self.preempt else schema.MANIFEST_FILE,
        }


def _text(flag: bool) -> str:
    return "true" if flag else "false"


# ``run``'s parser and plan: a command line's plan, or its one-line BadInput
# (dcp_invariant.cli.run_plan_of, handed in: the CLI is what runs this module). The second
# argument is the release the suite will run on, where the action installs it (``None``: the
# installed torch's, in the caller's environment): resume-with-torch names scenarios after it.
RunParser = Callable[[list[str], str | None], object]


def check(inputs: Mapping[str, str], run_parser: RunParser) -> Checked:
    """Every input, in ``action.yml``'s order; ActionInputError at the first bad one.

    ``inputs`` maps each input's name to its value (an input left out counts as empty).
    ``output-dir`` is read relative to the current directory, as the suite step reads it.
    """
    given = {name: inputs.get(name, "") for name in NAMES}
    environment = given["environment"].lower()
    if environment not in ("action", "caller"):
        raise ActionInputError(
            f"input environment {given['environment']!r} is neither 'action' nor 'caller'"
        )
    flags = {name: _boolean(name, given[name]) for name in BOOLEANS}
    torch_version = given["torch-version"]
    # Installed only into the action's own environment, and only for the suite.
    installed = environment == "action" and flags["run-suite"]
    if installed and torch_version not in runtimes.releases():
        raise ActionInputError(
            f"input torch-version {torch_version!r} is not a registered release: use one of "
            f"{', '.join(runtimes.releases())}"
        )
    revision = given["source-revision"]
    if not valid_revision(revision):
        raise ActionInputError(
            f"input source-revision {revision!r} is not a 40-hex commit SHA: leave it out "
            "(github.sha) or give a full SHA"
        )
    _artifact_name(given["artifact-name"])
    _retention_days(given["retention-days"])
    # Whitespace alone is no command: a matrix that leaves it empty for some jobs.
    preempt = bool(given["preempt-command"].strip())
    arguments: tuple[str, ...] = ()
    preempt_arguments: tuple[str, ...] = ()
    if preempt:
        preempt_arguments = _preempt_arguments(given, flags["run-suite"])
    else:
        for name in _PREEMPT_OPTIONS:
            if given[name]:
                raise ActionInputError(
                    f"input {name} {given[name]!r} goes with preempt-command, which is empty"
                )
        if flags["run-suite"]:
            release = torch_version if environment == "action" else None
            arguments = _run_arguments(given, lambda argv: run_parser(argv, release))
    return Checked(
        environment="caller" if environment == "caller" else "action",
        run_suite=flags["run-suite"],
        upload=flags["upload"],
        attest=flags["attest"],
        run_arguments=arguments,
        preempt=preempt,
        preempt_arguments=preempt_arguments,
    )


# The inputs checked, as action.yml names them.
NAMES = (
    "environment",
    "torch-version",
    "output-dir",
    "artifact-name",
    "source-revision",
    *BOOLEANS,
    "retention-days",
    "fixture",
    *_LOOP_INPUTS,
    "preempt-command",
    *_PREEMPT_OPTIONS,
)


def _boolean(name: str, value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise ActionInputError(f"input {name} {value!r} is neither 'true' nor 'false'")
    return value.lower() == "true"


def _artifact_name(value: str) -> None:
    from dcp_invariant import github
    from dcp_invariant.errors import ArtifactNameError

    try:
        github.artifact_name(value, "", {})
    except ArtifactNameError as exc:
        raise ActionInputError(f"input {exc}") from None


def _retention_days(value: str) -> None:
    # Any positive count: above what the repository allows, the upload lowers it to that
    # limit with a warning (actions/upload-artifact), so a larger one is not an error.
    if value and not (value.isascii() and value.isdigit() and int(value) >= 1):
        raise ActionInputError(
            f"input retention-days {value!r}: give a whole number of days, 1 or more, or leave "
            "it empty for the repository's setting"
        )


def _output_dir(given: Mapping[str, str]) -> str:
    output_dir = given["output-dir"]
    if not output_dir or "\n" in output_dir or "\r" in output_dir:
        raise ActionInputError(
            f"input output-dir {output_dir!r}: give a directory path on one line"
        )
    return output_dir


def _run_arguments(
    given: Mapping[str, str], run_parser: Callable[[list[str]], object]
) -> tuple[str, ...]:
    """``run``'s arguments from the inputs, each input held to ``run``'s grammar on its own."""
    from dcp_invariant.suite.output_dir import check_target

    output_dir = _output_dir(given)
    try:
        check_target(Path(output_dir))
    except BadInput as exc:
        raise ActionInputError(f"input output-dir {output_dir!r}: {exc}") from None
    single_line = (
        "fixture",
        "world-sizes",
        "steps-before",
        "steps-after",
        "rank-local",
        "ignore-attr",
        "resume-with-torch",
    )
    for name in single_line:
        # Each becomes one line of the arguments file: a line break (a YAML block scalar's
        # trailing one, say) would split it there.
        if "\n" in given[name] or "\r" in given[name]:
            raise ActionInputError(f"input {name} {given[name]!r}: give it on one line")
    base = ["--output-dir", output_dir, "--source-revision", given["source-revision"]]
    fixture = given["fixture"]
    own: dict[str, list[str]] = {"fixture": ["--fixture", fixture] if fixture else []}
    own["world-sizes"] = _flag("--world-sizes", given["world-sizes"])
    own["steps-before"] = _flag("--steps-before", given["steps-before"])
    own["steps-after"] = _flag("--steps-after", given["steps-after"])
    # One argument a non-empty line, as it is (a CRLF's CR dropped): never split further.
    lines = [line.removesuffix("\r") for line in given["fixture-args"].split("\n")]
    own["fixture-args"] = [a for line in lines if line for a in ("--fixture-arg", line)]
    own["rank-local"] = _listed("--rank-local", given["rank-local"])
    own["ignore-attr"] = _listed("--ignore-attr", given["ignore-attr"])
    own["resume-with-torch"] = _listed("--resume-with-torch", given["resume-with-torch"])
    for name in ("fixture", *_LOOP_INPUTS):
        if own[name]:
            alone = own["fixture"] + own[name] if name != "fixture" else own[name]
            _parsed(run_parser, base + alone, f"input {name} {given[name]!r}: ")
    arguments = [*base, *(a for name in ("fixture", *_LOOP_INPUTS) for a in own[name])]
    _parsed(run_parser, arguments, "the fixture inputs together: ")
    return tuple(arguments)


def _flag(flag: str, value: str) -> list[str]:
    return [flag, value] if value else []


def _listed(flag: str, value: str) -> list[str]:
    """A comma-separated input: one flag per item, blanks dropped."""
    items = ["".join(item.split()) for item in value.split(",")]
    return [a for item in items if item for a in (flag, item)]


def _parsed(
    run_parser: Callable[[list[str]], object], arguments: Sequence[str], prefix: str
) -> None:
    """``run``'s parser and plan on ``arguments``: its one line, prefixed, where they fail."""
    try:
        run_parser(["run", *arguments])
    except BadInput as exc:
        raise ActionInputError(f"{prefix}{exc}") from None


def _preempt_arguments(given: Mapping[str, str], run_suite: bool) -> tuple[str, ...]:
    """``preempt``'s arguments: its options, then ``--`` and the command as ``shlex.split``
    splits it, each argument as it is (the step passes them one a line, never to a shell).

    The options are held to ``preempt``'s own checks, one input at a time; the command to the
    ones that do not depend on the step's PATH (``python`` or ``torchrun`` may only be there
    once the action's environment is: ``preempt`` looks the program up itself)."""
    from dcp_invariant.preempt import command
    from dcp_invariant.preempt.launch import RUN_DIR

    text = given["preempt-command"]
    if not run_suite:
        raise ActionInputError(
            "input run-suite 'false' only verifies output-dir, and preempt-command runs a check: "
            "leave run-suite 'true' or preempt-command empty"
        )
    for name in ("fixture", *_LOOP_INPUTS):
        if given[name]:
            raise ActionInputError(
                f"input {name} {given[name]!r} goes with the suite, and preempt-command runs your "
                "own job instead: give one of them (use the action twice for both)"
            )
    if sys.platform != "linux":
        raise ActionInputError(
            f"input preempt-command: preempt runs on Linux only (this runner is {sys.platform}): "
            "it hears the job's file operations through LD_PRELOAD; run it on a Linux runner"
        )
    try:
        argv = shlex.split(text)
    except ValueError as exc:  # an unclosed quote, a trailing backslash
        raise ActionInputError(
            f"input preempt-command {text!r}: {str(exc).lower()}: it is split as a shell splits "
            "words (shlex), and never given to one"
        ) from None
    if not any(RUN_DIR in argument for argument in argv):
        raise ActionInputError(
            f"input preempt-command {text!r} has no {RUN_DIR}: put it where the job takes the "
            f"directory it writes its checkpoints to (e.g. --output-dir {RUN_DIR})"
        )
    broken = [a for a in argv if "\n" in a or "\r" in a]
    if broken:
        raise ActionInputError(
            f"input preempt-command: the argument {broken[0]!r} holds a line break: put what it "
            "runs in a script of your checkout and give its path"
        )
    for name in _PREEMPT_OPTIONS:
        if "\n" in given[name] or "\r" in given[name]:
            raise ActionInputError(f"input {name} {given[name]!r}: give it on one line")
    crash_points = given["preempt-crash-points"]
    if crash_points and not (crash_points.isascii() and crash_points.isdigit()):
        raise ActionInputError(
            f"input preempt-crash-points {crash_points!r}: give a whole number, 1 or more, or "
            f"leave it empty for preempt's default, {command.DEFAULT_CRASH_POINTS}"
        )
    output_dir = _output_dir(given)

    # preempt's own checks of each option, with a stand-in command that passes them.
    def alone(
        step_line: str | None = None,
        final: str | None = None,
        crash_points: int = 1,
        directory: Path | None = None,
    ) -> object:
        return command.checked_options(
            command=(sys.executable, RUN_DIR),
            step_line=step_line,
            final=final,
            crash_points=crash_points,
            timeout=command.DEFAULT_TIMEOUT,
            output_dir=directory,
        )

    checks: dict[str, Callable[[str], object]] = {
        "preempt-final": lambda value: alone(final=value),
        "preempt-step-line": lambda value: alone(step_line=value),
        "preempt-crash-points": lambda value: alone(crash_points=int(value)),
        "output-dir": lambda value: alone(directory=Path(value)),
    }
    for name, checked in checks.items():
        if given[name]:
            try:
                checked(given[name])
            except BadInput as exc:
                raise ActionInputError(f"input {name} {given[name]!r}: {exc}") from None
    # FLAG=VALUE, each one argument: a --step-line that starts with "-" stays its value.
    arguments = [f"--output-dir={output_dir}"]
    arguments += [f"{flag}={given[name]}" for name, flag in _PREEMPT_OPTIONS.items() if given[name]]
    return (*arguments, "--", *argv)
