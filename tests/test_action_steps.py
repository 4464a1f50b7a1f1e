"""The composite action's own shell steps, run in order by a small simulated runner.

The harness reads action.yml, resolves inputs, ``env:`` and ``if:`` the way GitHub does for the
handful of expression forms the action uses (and raises on any other, so it cannot quietly
approve something it does not understand), runs each ``run:`` step with bash, and skips
``uses:`` steps, recording whether they would have run and with what.

Nothing here touches the network or torch: a ``python`` shim first on PATH logs ``pip install``
instead of installing, and stands in for ``dcp_invariant run`` by copying a prepared artifact
(after importing a ``--fixture`` module from the current directory, as ``run`` does).
``github-report`` and ``verify`` run the real package.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import dcp_invariant
from dcp_invariant import plan, runtimes
from dcp_invariant.evidence import schema

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(
    BASH is None, reason="bash is not on PATH: the action's steps are bash scripts"
)

REPO = Path(__file__).resolve().parents[1]
ACTION = REPO / "action.yml"
STEP_TIMEOUT = 120
SHA = "0123456789abcdef0123456789abcdef01234567"
RUNNER = {"GITHUB_JOB": "integration", "RUNNER_OS": "Linux", "GITHUB_RUN_ATTEMPT": "7"}
PYTHON_XY = f"{sys.version_info.major}.{sys.version_info.minor}"
STEP_KEYS = {"name", "id", "if", "uses", "with", "shell", "env", "run"}

SHIM = """\
#!/usr/bin/env bash
# `python` for the simulated runner. Only two invocations are faked; the rest is the real one.
set -euo pipefail
real={real}
if [ "$#" -ge 3 ] && [ "$1" = -m ] && [ "$2" = pip ] && [ "$3" = install ]; then
  # No network: record what would be installed, one invocation per line, tab-separated.
  shift 3
  printf '%s\\t' "$@" >> "$DCP_TEST_PIP_LOG"
  printf '\\n' >> "$DCP_TEST_PIP_LOG"
  exit 0
fi
if [ "$#" -ge 3 ] && [ "$1" = -m ] && [ "$2" = dcp_invariant ] && [ "$3" = run ]; then
  # No suite: "write" the prepared artifact where --output-dir says, and exit as told.
  shift 3
  printf '%s\\t' "$@" >> "$DCP_TEST_SUITE_LOG"
  printf '\\n' >> "$DCP_TEST_SUITE_LOG"
  output_dir=
  fixture=
  while [ "$#" -gt 0 ]; do
    case "$1" in
      --output-dir) output_dir=$2; shift 2 ;;
      --output-dir=*) output_dir=${{1#--output-dir=}}; shift ;;
      --fixture) fixture=$2; shift 2 ;;
      *) shift ;;
    esac
  done
  if [ -n "$fixture" ]; then
    # As `run` does first: import MODULE with the current directory first on sys.path, and
    # exit 2 when MODULE:CALLABLE is not there.
    "$real" -c 'import importlib, sys
sys.path.insert(0, "")
module, _, name = sys.argv[1].partition(":")
try:
    getattr(importlib.import_module(module), name)
except (ImportError, AttributeError) as error:
    sys.exit(f"dcp-invariant: error: fixture {{sys.argv[1]}}: {{error}}")' "$fixture" || exit 2
  fi
  # copytree refuses an existing directory, as `run` does; Python copes with Windows paths.
  "$real" -c 'import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2])' \\
    "$DCP_TEST_SUITE_ARTIFACT" "$output_dir"
  exit "$DCP_TEST_SUITE_EXIT"
fi
exec "$real" "$@"
"""


class UnsupportedExpression(AssertionError):
    """action.yml uses an expression this harness does not model: extend it deliberately."""


def load_action() -> dict[str, Any]:
    # Imported here: ruamel.yaml comes with the `test` extra, which the live job lacks while
    # still collecting this module.
    from ruamel.yaml import YAML

    return YAML(typ="safe").load(ACTION.read_text(encoding="utf-8"))


# --- the expression subset -------------------------------------------------------------------


@dataclass
class Context:
    inputs: dict[str, str]
    sha: str
    outputs: dict[str, dict[str, str]] = field(default_factory=dict)  # step id -> outputs
    outcomes: dict[str, str] = field(default_factory=dict)  # step id -> outcome
    failed: bool = False  # has any step failed so far (what success() checks)

    def value(self, expression: str) -> str:
        expression = expression.strip()
        if match := re.fullmatch(r"inputs\.([\w-]+)", expression):
            if match[1] not in self.inputs:
                raise UnsupportedExpression(f"undeclared input in {expression!r}")
            return self.inputs[match[1]]
        if expression == "github.sha":
            return self.sha
        if match := re.fullmatch(r"steps\.([\w-]+)\.outputs\.([\w-]+)", expression):
            if match[1] not in self.outcomes:
                raise UnsupportedExpression(f"{expression!r}: no earlier step has id {match[1]!r}")
            # GitHub yields an empty string for an output the step did not set.
            return self.outputs.get(match[1], {}).get(match[2], "")
        if match := re.fullmatch(r"steps\.([\w-]+)\.outcome", expression):
            if match[1] not in self.outcomes:
                raise UnsupportedExpression(f"{expression!r}: no earlier step has id {match[1]!r}")
            return self.outcomes[match[1]]
        raise UnsupportedExpression(expression)

    def substitute(self, text: str) -> str:
        """Replace each ``${{ ... }}`` in a value (env:, with:, an input default)."""
        if not isinstance(text, str):
            raise UnsupportedExpression(f"non-string value {text!r}")
        resolved = re.sub(r"\$\{\{(.*?)\}\}", lambda m: self.value(m[1]), text)
        if "${{" in resolved:
            raise UnsupportedExpression(text)
        return resolved

    def condition(self, text: str) -> bool:
        """``if:`` as GitHub evaluates the forms action.yml uses; no ``if:`` is success()."""
        text = text.strip()
        if not text:
            return not self.failed
        if match := re.fullmatch(r"\$\{\{(.*)\}\}", text, re.DOTALL):
            text = match[1].strip()
        status_function = False
        values = []
        for term in (t.strip() for t in text.split("&&")):
            if term in ("!cancelled()", "always()"):
                # Nothing is cancelled in the simulation.
                status_function = True
                values.append(True)
            elif match := re.fullmatch(r"(\S+)\s*(==|!=)\s*'([^']*)'", term):
                if not match[1].startswith(("inputs.", "steps.")):
                    raise UnsupportedExpression(term)
                # GitHub compares strings ignoring case.
                equal = self.value(match[1]).casefold() == match[3].casefold()
                values.append(equal if match[2] == "==" else not equal)
            else:
                raise UnsupportedExpression(term)
        if not status_function:
            # Without a status function GitHub adds an implicit success(): no earlier failure.
            values.append(not self.failed)
        return all(values)


# --- the runner ------------------------------------------------------------------------------


@dataclass
class StepRun:
    index: int
    step: dict[str, Any]
    outcome: str  # success, failure or skipped; a `uses:` step that would run counts as success
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    outputs: dict[str, str] = field(default_factory=dict)
    summary: str = ""
    with_: dict[str, str] = field(default_factory=dict)  # resolved `with:` of a `uses:` step


@dataclass
class ActionRun:
    steps: list[StepRun]
    outputs: dict[str, str]  # the action's declared outputs, resolved
    workspace: Path
    pip_log: list[list[str]]
    suite_log: list[list[str]]

    @property
    def summary(self) -> str:
        return "".join(s.summary for s in self.steps)

    def running(self, command: str) -> StepRun:
        """The one step whose script contains ``command``."""
        found = [s for s in self.steps if command in s.step.get("run", "")]
        assert len(found) == 1, f"{len(found)} steps run {command!r}"
        return found[0]

    def using(self, action: str) -> StepRun:
        found = [s for s in self.steps if s.step.get("uses", "").startswith(f"{action}@")]
        assert len(found) == 1, f"{len(found)} steps use {action}"
        return found[0]

    @property
    def gate(self) -> StepRun:
        return self.steps[-1]

    @property
    def report(self) -> StepRun:
        return self.running("dcp_invariant github-report")

    @property
    def suite(self) -> StepRun:
        return self.running("dcp_invariant run")

    @property
    def torch_install(self) -> StepRun:
        return self.running("torch==")


def parse_output_file(text: str) -> dict[str, str]:
    """$GITHUB_OUTPUT: ``key=value`` lines and ``key<<DELIMITER`` blocks."""
    values: dict[str, str] = {}
    lines = iter(text.splitlines())
    for line in lines:
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, delimiter = line.split("<<", 1)
            body = []
            for body_line in lines:
                if body_line == delimiter:
                    break
                body.append(body_line)
            else:
                raise AssertionError(f"output {key}: no closing {delimiter!r}")
            values[key] = "\n".join(body)
        elif line:
            key, value = line.split("=", 1)
            values[key] = value
    return values


def read_log(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.rstrip("\t").split("\t") for line in path.read_text().splitlines()]


def run_action(
    root: Path,
    *,
    inputs: Mapping[str, str] = {},
    suite_artifact: Path | None = None,
    suite_exit: int = 0,
    prepare: Callable[[Path], None] | None = None,
) -> ActionRun:
    """Run action.yml's steps as a runner would, in ``root/workspace``."""
    action = load_action()
    workspace, temp, shim_dir, files = (root / d for d in ("workspace", "temp", "shim", "files"))
    for d in (workspace, temp, shim_dir, files):
        d.mkdir()
    if prepare is not None:
        prepare(workspace)
    pip_log, suite_log = files / "pip.log", files / "suite.log"

    shim = shim_dir / "python"
    shim.write_text(
        SHIM.format(real=shlex.quote(Path(sys.executable).as_posix())),
        encoding="utf-8",
        newline="\n",
    )
    shim.chmod(0o755)

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GITHUB_", "RUNNER_", "INPUT_", "DCP_TEST_"))
    }
    env.update(RUNNER)
    env.update(
        {
            "GITHUB_ACTIONS": "true",
            "GITHUB_ACTION_PATH": str(REPO),
            "GITHUB_WORKSPACE": str(workspace),
            "GITHUB_SHA": SHA,
            "RUNNER_TEMP": str(temp),
            "PATH": str(shim_dir) + os.pathsep + os.environ.get("PATH", ""),
            # The faked install would have made the package under test importable.
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(Path(dcp_invariant.__file__).parents[1]), env.get("PYTHONPATH")])
            ),
            # Should a pip get past the shim anyway, it must not reach an index.
            "PIP_NO_INDEX": "1",
            "DCP_TEST_PIP_LOG": pip_log.as_posix(),
            "DCP_TEST_SUITE_LOG": suite_log.as_posix(),
            "DCP_TEST_SUITE_ARTIFACT": str(suite_artifact or files / "no-suite-expected"),
            "DCP_TEST_SUITE_EXIT": str(suite_exit),
        }
    )

    context = Context(inputs={}, sha=SHA)
    declared = action.get("inputs") or {}
    unknown = set(inputs) - set(declared)
    assert not unknown, f"action.yml declares no input {unknown}"
    context.inputs = {
        name: inputs[name] if name in inputs else context.substitute(spec.get("default", ""))
        for name, spec in declared.items()
    }

    runs: list[StepRun] = []
    for index, step in enumerate(action["runs"]["steps"]):
        extra = set(step) - STEP_KEYS
        if extra:
            raise UnsupportedExpression(f"step {index} uses keys the harness ignores: {extra}")
        ran = run_step(index, step, context, env, workspace, files)
        runs.append(ran)
        if ran.outcome == "failure":
            context.failed = True
        if "id" in step:
            context.outcomes[step["id"]] = ran.outcome
            context.outputs[step["id"]] = ran.outputs

    outputs = {
        name: context.substitute(spec["value"])
        for name, spec in (action.get("outputs") or {}).items()
    }
    return ActionRun(runs, outputs, workspace, read_log(pip_log), read_log(suite_log))


def run_step(
    index: int,
    step: dict[str, Any],
    context: Context,
    runner_env: dict[str, str],
    workspace: Path,
    files: Path,
) -> StepRun:
    if not context.condition(str(step.get("if", ""))):
        return StepRun(index, step, "skipped")
    if "uses" in step:
        # Not executed; what it would have been given is kept for the tests.
        with_ = {k: context.substitute(str(v)) for k, v in (step.get("with") or {}).items()}
        return StepRun(index, step, "success", with_=with_)
    if step.get("shell") != "bash":
        raise UnsupportedExpression(f"step {index}: the harness runs only shell: bash")
    if "${{" in step["run"]:
        raise UnsupportedExpression(f"step {index}: an expression inside run:")

    # The runner gives every step fresh command files.
    command_files = {
        name: files / f"step{index}-{name.lower()}"
        for name in ("GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY", "GITHUB_ENV", "GITHUB_PATH")
    }
    for path in command_files.values():
        path.write_text("")
    env = {**runner_env, **{k: str(v) for k, v in command_files.items()}}
    env.update({k: context.substitute(str(v)) for k, v in (step.get("env") or {}).items()})
    script = files / f"step{index}.sh"
    script.write_text(step["run"] + "\n", encoding="utf-8", newline="\n")

    # GitHub's `shell: bash` is `bash --noprofile --norc -eo pipefail {0}`.
    assert BASH is not None
    done = subprocess.run(
        [BASH, "--noprofile", "--norc", "-eo", "pipefail", script.as_posix()],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=STEP_TIMEOUT,
        check=False,
    )
    for name in ("GITHUB_ENV", "GITHUB_PATH"):
        # The harness does not carry these to later steps; an action that uses them needs it to.
        assert command_files[name].read_text() == "", f"step {index} wrote ${name}"
    return StepRun(
        index,
        step,
        "success" if done.returncode == 0 else "failure",
        returncode=done.returncode,
        stdout=done.stdout,
        stderr=done.stderr,
        outputs=parse_output_file(command_files["GITHUB_OUTPUT"].read_text(encoding="utf-8")),
        summary=command_files["GITHUB_STEP_SUMMARY"].read_text(encoding="utf-8"),
    )


def table_rows(markdown: str) -> dict[str, list[str]]:
    """Scenario rows of the summary table: name -> [verdict, reason]."""
    rows = {}
    for line in markdown.splitlines():
        match = re.fullmatch(r"\| `(\w+)` \|(.*)\|", line)
        if match:
            rows[match[1]] = [cell.strip() for cell in match[2].split(" | ")]
    return rows


def tamper(directory: Path) -> None:
    # What the integration job does: one byte appended to a hashed file.
    with open(directory / schema.SUMMARY_FILE, "ab") as f:
        f.write(b" ")


# --- the harness itself ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "failed", "expected"),
    [
        ("", False, True),  # no if: is success()
        ("", True, False),
        ("inputs.upload == 'true'", False, True),
        ("inputs.upload == 'TRUE'", False, True),
        ("inputs.upload == 'true'", True, False),  # implicit success()
        ("${{ !cancelled() && inputs.upload == 'true' }}", True, True),
        ("always()", True, True),
        ("inputs.retention-days != ''", False, False),
        ("steps.install.outcome == 'success'", False, True),
    ],
)
def test_condition_evaluator(condition: str, failed: bool, expected: bool) -> None:
    context = Context({"upload": "true", "retention-days": ""}, SHA, failed=failed)
    context.outcomes["install"] = "success"

    assert context.condition(condition) is expected


@pytest.mark.parametrize(
    "condition",
    [
        "failure()",
        "github.event_name == 'push'",
        "inputs.upload || always()",
        "steps.nope.outcome == 'x'",
    ],
)
def test_condition_evaluator_refuses_what_it_does_not_model(condition: str) -> None:
    context = Context({"upload": "true"}, SHA)

    with pytest.raises(UnsupportedExpression):
        context.condition(condition)


def test_substitution_refuses_other_contexts() -> None:
    context = Context({"upload": "true"}, SHA)

    assert context.substitute("${{ inputs.upload }}-${{ github.sha }}") == f"true-{SHA}"
    for text in ("${{ github.token }}", "${{ secrets.X }}", "${{ inputs.nope }}"):
        with pytest.raises(UnsupportedExpression):
            context.substitute(text)


# --- the action ------------------------------------------------------------------------------


def test_passing_artifact(tmp_path: Path, data_artifact: Path) -> None:
    run = run_action(tmp_path, suite_artifact=data_artifact, suite_exit=0)

    failures = [(s.index, s.stderr) for s in run.steps if s.outcome == "failure"]
    assert failures == []

    # torch from the CPU index at the default version; the package from the action's checkout.
    torch = [args for args in run.pip_log if any(a.startswith("torch==") for a in args)]
    assert len(torch) == 1
    assert f"torch=={runtimes.DEFAULT_TORCH_VERSION}" in torch[0]
    assert torch[0][torch[0].index("--index-url") + 1] == runtimes.CPU_INDEX
    assert any(str(REPO) in args for args in run.pip_log)

    # The suite got the default output dir and the commit under test.
    assert len(run.suite_log) == 1
    suite_args = run.suite_log[0]
    assert suite_args[suite_args.index("--output-dir") + 1] == "dcp-invariant-evidence"
    assert suite_args[suite_args.index("--source-revision") + 1] == SHA

    evidence = run.workspace / "dcp-invariant-evidence"
    manifest = (evidence / schema.MANIFEST_FILE).read_bytes()
    assert run.outputs == {
        "verdict": "pass",
        "passed": "11",
        "failed": "0",
        "manifest-sha256": hashlib.sha256(manifest).hexdigest(),
        "evidence-dir": str(evidence.resolve()),
    }
    assert Path(run.outputs["evidence-dir"]).is_absolute()

    # The default name is unique per matrix job and per attempt.
    name = run.report.outputs["artifact-name"]
    for part in (
        RUNNER["GITHUB_JOB"],
        RUNNER["RUNNER_OS"],
        f"py{PYTHON_XY}",
        f"torch{runtimes.DEFAULT_TORCH_VERSION}",
        f"attempt{RUNNER['GITHUB_RUN_ATTEMPT']}",
    ):
        assert part in name
    upload = run.using("actions/upload-artifact")
    assert upload.outcome == "success"
    assert upload.with_["name"] == name
    assert upload.with_["path"] == "dcp-invariant-evidence"

    rows = table_rows(run.summary)
    assert list(rows) == list(plan.SCENARIO_NAMES)
    assert {row[0] for row in rows.values()} == {"pass"}
    assert "| scenario | verdict | reason |" in run.summary.splitlines()

    assert run.gate.outcome == "success"


def test_failing_artifact(tmp_path: Path, rebuild: Callable) -> None:
    def promote_the_corrupt_candidate(observations: dict) -> None:
        observations["corrupt_shard"]["candidate"]["promoted"] = True

    failing = rebuild(promote_the_corrupt_candidate)
    run = run_action(tmp_path, suite_artifact=failing, suite_exit=1)

    assert run.suite.outcome == "failure"
    # The report runs after the failure and tells what failed.
    assert run.report.outcome == "success"
    assert run.outputs["verdict"] == "fail"
    assert (run.outputs["passed"], run.outputs["failed"]) == ("10", "1")
    rows = table_rows(run.summary)
    assert rows["corrupt_shard"] == ["fail", "candidate: step-4 was promoted"]
    assert [name for name, row in rows.items() if row[0] != "pass"] == ["corrupt_shard"]
    # The evidence of a failure is the evidence most worth keeping.
    assert run.using("actions/upload-artifact").outcome == "success"

    assert run.gate.outcome == "failure"
    assert run.gate.returncode not in (0, None)


def test_tampered_artifact_is_rejected_without_running_the_suite(
    tmp_path: Path, data_artifact: Path
) -> None:
    def tampered_copy(workspace: Path) -> None:
        shutil.copytree(data_artifact, workspace / "tampered")
        tamper(workspace / "tampered")

    run = run_action(
        tmp_path,
        inputs={
            "python-version": "",
            "run-suite": "false",
            "upload": "false",
            "output-dir": "tampered",
        },
        prepare=tampered_copy,
    )

    assert run.using("actions/setup-python").outcome == "skipped"
    assert run.torch_install.outcome == "skipped"
    assert run.suite.outcome == "skipped"
    assert run.suite_log == []
    assert not any(a.startswith("torch") for args in run.pip_log for a in args)
    assert any(str(REPO) in args for args in run.pip_log)

    assert run.report.outcome == "success"
    assert run.outputs["verdict"] == "fail"
    assert run.using("actions/upload-artifact").outcome == "skipped"
    assert run.gate.outcome == "failure"
    assert run.gate.returncode == 1


def test_invalid_artifact_name_stops_the_report(tmp_path: Path, data_artifact: Path) -> None:
    run = run_action(
        tmp_path,
        inputs={"artifact-name": "evidence/run-1"},
        suite_artifact=data_artifact,
        suite_exit=0,
    )

    assert run.suite.outcome == "success"
    assert run.report.outcome == "failure"
    assert run.report.returncode == 2
    lines = run.report.stderr.splitlines()
    assert len(lines) == 1, run.report.stderr
    assert "artifact-name" in lines[0]
    # Bad input writes nothing: no outputs and no summary under a name that cannot be used.
    assert run.report.outputs == {}
    assert run.report.summary == ""
    assert run.using("actions/upload-artifact").outcome == "skipped"
    # The gate still gives the evidence its verdict.
    assert run.gate.outcome == "success"


# --- a fixture run ---------------------------------------------------------------------------
#
# The shim copies the registered artifact for these too: what is tested is the command line the
# suite step builds and where it runs, not a fixture run's evidence.

BASE_ARGS = ["--output-dir", "dcp-invariant-evidence", "--source-revision", SHA]
FIXTURE = "my_project.checks:make_app"
FIXTURE_OPTIONS = {"world-sizes": "1,2", "steps-before": "4", "steps-after": "2"}


def caller_checkout(workspace: Path) -> None:
    """The caller's repository as actions/checkout leaves it: a package at the workspace root."""
    package = workspace / "my_project"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "checks.py").write_text(
        "def make_app(rank, world_size):\n    raise NotImplementedError\n", encoding="utf-8"
    )


def test_registered_suite_gets_no_fixture_arguments(tmp_path: Path, data_artifact: Path) -> None:
    run = run_action(tmp_path, suite_artifact=data_artifact)

    assert run.suite.outcome == "success", run.suite.stderr
    assert run.suite_log == [BASE_ARGS]


def test_fixture_inputs_reach_the_command_line(tmp_path: Path, data_artifact: Path) -> None:
    run = run_action(
        tmp_path,
        inputs={"fixture": FIXTURE, **FIXTURE_OPTIONS},
        suite_artifact=data_artifact,
        prepare=caller_checkout,
    )

    # The step ran in the workspace, so the caller's module imported from there.
    assert run.suite.outcome == "success", run.suite.stderr
    assert run.suite_log == [
        [
            *BASE_ARGS,
            "--fixture",
            FIXTURE,
            "--world-sizes",
            "1,2",
            "--steps-before",
            "4",
            "--steps-after",
            "2",
        ]
    ]
    assert run.gate.outcome == "success"


@pytest.mark.parametrize("given", sorted(FIXTURE_OPTIONS))
def test_empty_fixture_inputs_add_nothing(tmp_path: Path, data_artifact: Path, given: str) -> None:
    run = run_action(
        tmp_path,
        inputs={"fixture": FIXTURE, given: FIXTURE_OPTIONS[given]},
        suite_artifact=data_artifact,
        prepare=caller_checkout,
    )

    # The inputs left empty pass no flag: the tool's own defaults apply.
    assert run.suite.outcome == "success", run.suite.stderr
    assert run.suite_log == [
        [*BASE_ARGS, "--fixture", FIXTURE, f"--{given}", FIXTURE_OPTIONS[given]]
    ]


def test_fixture_inputs_are_single_arguments_never_shell(
    tmp_path: Path, data_artifact: Path
) -> None:
    hostile = {
        "fixture": 'x:y $(touch pwned) "; touch pwned; #',
        "world-sizes": "1 2 `touch pwned`",
        "steps-before": "--help",
        "steps-after": "3 --timeout 1",
    }
    run = run_action(tmp_path, inputs=hostile, suite_artifact=data_artifact)

    assert run.suite_log == [
        [
            *BASE_ARGS,
            "--fixture",
            hostile["fixture"],
            "--world-sizes",
            hostile["world-sizes"],
            "--steps-before",
            hostile["steps-before"],
            "--steps-after",
            hostile["steps-after"],
        ]
    ]
    assert not (run.workspace / "pwned").exists()
    assert run.suite.outcome == "failure"


def test_fixture_missing_from_the_workspace_fails_the_suite(
    tmp_path: Path, data_artifact: Path
) -> None:
    # Without caller_checkout the module is nowhere: the positive test's import was the
    # workspace's, not something else on the path.
    run = run_action(tmp_path, inputs={"fixture": FIXTURE}, suite_artifact=data_artifact)

    assert run.suite.outcome == "failure"
    assert run.suite.returncode == 2
    assert "my_project" in run.suite.stderr
    assert not (run.workspace / "dcp-invariant-evidence").exists()
    assert run.report.outcome == "success"
    assert run.outputs["verdict"] == "fail"
    assert run.gate.outcome == "failure"
