"""The composite action's own shell steps, run in order by a small simulated runner.

The harness reads action.yml, resolves inputs, ``env:`` and ``if:`` the way GitHub does for the
handful of expression forms the action uses (and raises on any other, so it cannot quietly
approve something it does not understand), runs each ``run:`` step with bash, and skips
``uses:`` steps, recording whether they would have run and with what.

Nothing here touches the network or torch: a ``python`` shim first on PATH stands in for the
caller's Python. Its ``-m venv`` makes a stand-in environment whose interpreters are the shim
again (as ``venv``); ``pip install`` and ``uv pip install`` are logged instead of installing (the
caller's Python can be made to refuse ``pip install`` as an externally managed one does), and
``dcp_invariant run`` copies a prepared artifact (after importing a ``--fixture`` module from the
current directory, as ``run`` does). Every invocation is logged with the interpreter that ran it.
``dcp_invariant preempt`` runs no job either: it logs the python the job would find on PATH and
the arguments it got, exactly as they arrived, and copies prepared evidence (a ``preempt.json``).
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
from typing import Any, cast

import pytest
from artifact_data import Observations, Rebuild
from local_runner import (
    Outcome,
    Scope,
    StepResult,
    UnsupportedWorkflow,
    load_yaml,
    parse_command_file,
)

import dcp_invariant
from dcp_invariant import plan, runtimes
from dcp_invariant.evidence import schema

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(
    BASH is None, reason="bash is not on PATH: the action's steps are bash scripts"
)

REPO = Path(__file__).resolve().parents[1]
ACTION = REPO / "action.yml"
# How the environment step runs `dcp-invariant action-inputs` from the action's checkout.
INPUTS_CHECK = (
    'import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); runpy.run_module("dcp_invariant", '
    'run_name="__main__")'
)
STEP_TIMEOUT = 120
SHA = "0123456789abcdef0123456789abcdef01234567"
BASE_ARGS = ["--output-dir", "dcp-invariant-evidence", "--source-revision", SHA]
FIXTURE = "my_project.checks:make_app"
FIXTURE_OPTIONS = {"world-sizes": "1,2", "steps-before": "4", "steps-after": "2"}
RUNNER = {
    "GITHUB_JOB": "integration",
    "RUNNER_OS": "Linux",
    "RUNNER_ARCH": "X64",
    "ImageOS": "ubuntu24",
    "GITHUB_RUN_ATTEMPT": "7",
}
PYTHON_XY = f"{sys.version_info.major}.{sys.version_info.minor}"
STEP_KEYS = {"name", "id", "if", "uses", "with", "shell", "env", "run"}

SHIM = """\
#!/usr/bin/env bash
# `python` for the simulated runner. A few invocations are faked; the rest is the real one.
# role: caller (the Python on PATH), setup-python (what actions/setup-python set up), or venv
# (an interpreter of an environment that this shim's `-m venv` made).
set -euo pipefail
real={real}
role={role}
# Every invocation, one line, tab-separated: role, the path it was run as, the arguments.
printf '%s\\t%s\\t' "$role" "$0" >> "$DCP_TEST_CALL_LOG"
printf '%s\\t' "$@" >> "$DCP_TEST_CALL_LOG"
printf '\\n' >> "$DCP_TEST_CALL_LOG"
if [ "$#" -ge 2 ] && [ "$1" = -m ] && [ "$2" = venv ]; then
  # An environment whose interpreters (both layouts) are this shim as role venv; no pip, no uv.
  dir=${{!#}}
  mkdir -p "$dir/bin" "$dir/Scripts"
  printf 'home = %s\\n' "$(dirname "$0")" > "$dir/pyvenv.cfg"
  sed 's/^role=.*$/role=venv/' "$0" > "$dir/bin/python"
  cp "$dir/bin/python" "$dir/Scripts/python.exe"
  chmod 755 "$dir/bin/python" "$dir/Scripts/python.exe"
  exit 0
fi
if [ "$#" -ge 3 ] && [ "$1" = -m ] && [ "$2" = pip ] && [ "$3" = install ]; then
  if [ "$role" != venv ] && [ -n "${{DCP_TEST_EXTERNALLY_MANAGED:-}}" ]; then
    # What pip says on a Python marked EXTERNALLY-MANAGED (PEP 668), e.g. ubuntu-24.04's.
    echo "error: externally-managed-environment" >&2
    exit 1
  fi
  # No network: the call log says what would have been installed.
  for arg in "$@"; do
    case "$arg" in
      uv==*) touch "$(dirname "$(dirname "$0")")/uv-installed" ;;
    esac
  done
  exit 0
fi
if [ "$#" -ge 2 ] && [ "$1" = -m ] && [ "$2" = uv ]; then
  if [ "$role" != venv ] || [ ! -e "$(dirname "$(dirname "$0")")/uv-installed" ]; then
    echo "$0: No module named uv" >&2
    exit 1
  fi
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
  # No prepared artifact: a suite that writes nothing (a refused runtime, say).
  if [ -e "$DCP_TEST_SUITE_ARTIFACT" ]; then
    # copytree refuses an existing directory, as `run` does; Python copes with Windows paths.
    "$real" -c 'import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2])' \\
      "$DCP_TEST_SUITE_ARTIFACT" "$output_dir"
  fi
  exit "$DCP_TEST_SUITE_EXIT"
fi
if [ "$#" -ge 3 ] && [ "$1" = -m ] && [ "$2" = dcp_invariant ] && [ "$3" = preempt ]; then
  # No job: log the python the job's command would find on PATH, then preempt's arguments as
  # they arrived, and "write" the prepared evidence where --output-dir= says.
  shift 3
  printf '%s\t' "$(command -v python)" "$@" >> "$DCP_TEST_PREEMPT_LOG"
  printf '\n' >> "$DCP_TEST_PREEMPT_LOG"
  output_dir=
  for arg in "$@"; do
    case "$arg" in
      --output-dir=*) output_dir=${{arg#--output-dir=}} ;;
      --) break ;;
    esac
  done
  if [ -e "$DCP_TEST_SUITE_ARTIFACT" ]; then
    "$real" -c 'import shutil, sys; shutil.copytree(sys.argv[1], sys.argv[2])' \\
      "$DCP_TEST_SUITE_ARTIFACT" "$output_dir"
  fi
  exit "$DCP_TEST_SUITE_EXIT"
fi
exec "$real" "$@"
"""


def load_action() -> dict[str, Any]:
    return cast(dict[str, Any], load_yaml(ACTION))


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


@dataclass(frozen=True)
class Call:
    """One invocation of a stand-in interpreter."""

    role: str  # caller, setup-python or venv
    path: str  # what it was run as
    args: list[str]


@dataclass
class ActionRun:
    steps: list[StepRun]
    outputs: dict[str, str]  # the action's declared outputs, resolved
    workspace: Path
    temp: Path  # $RUNNER_TEMP
    calls: list[Call]
    suite_log: list[list[str]]
    preempt_log: list[list[str]]  # each: the python on the job's PATH, then preempt's arguments

    def installs(self, *module: str) -> list[Call]:
        """Calls of ``-m MODULE... install``, e.g. ``installs("pip")``, ``installs("uv", "pip")``."""
        prefix = ["-m", *module, "install"]
        return [c for c in self.calls if c.args[: len(prefix)] == prefix]

    @property
    def uv_install(self) -> list[str]:
        """The arguments of the one ``uv pip install``."""
        found = self.installs("uv", "pip")
        assert len(found) == 1, found
        return found[0].args[4:]

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
    def preempt(self) -> StepRun:
        return self.running("dcp_invariant preempt")

    @property
    def install(self) -> StepRun:
        return self.running("uv pip install")


def read_log(path: Path) -> list[list[str]]:
    if not path.exists():
        return []
    return [line.rstrip("\t").split("\t") for line in path.read_text().splitlines()]


def native(path: str) -> str:
    """A path in one spelling, to compare: on Windows bash may say /c/x for C:\\x, and / for \\."""
    if sys.platform == "win32" and (match := re.fullmatch(r"/([a-zA-Z])/(.*)", path)):
        path = f"{match[1]}:/{match[2]}"
    return os.path.normcase(os.path.normpath(path))


def read_calls(path: Path) -> list[Call]:
    calls = []
    for line in read_log(path):
        role, invoked, *args = line
        calls.append(Call(role, native(invoked), [a for a in args if a]))
    return calls


def write_shim(path: Path, role: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        SHIM.format(real=shlex.quote(Path(sys.executable).as_posix()), role=role),
        encoding="utf-8",
        newline="\n",
    )
    path.chmod(0o755)


def run_action(
    root: Path,
    *,
    inputs: Mapping[str, str] = {},
    suite_artifact: Path | None = None,
    suite_exit: int = 0,
    prepare: Callable[[Path], None] | None = None,
    runner: Mapping[str, str] = {},
    externally_managed: bool = False,
    earlier_runs: int = 0,
) -> ActionRun:
    """Run action.yml's steps as a runner would, in ``root/workspace``.

    ``runner`` overrides runner variables (RUNNER_OS); ``externally_managed`` makes the caller's
    Python refuse ``pip install`` as a PEP 668 one does; ``earlier_runs`` leaves that many
    environments of earlier uses of the action in this job in ``$RUNNER_TEMP``.
    """
    action = load_action()
    workspace, temp, shim_dir, files = (root / d for d in ("workspace", "temp", "shim", "files"))
    for d in (workspace, temp, shim_dir, files):
        d.mkdir()
    if prepare is not None:
        prepare(workspace)
    for n in range(1, earlier_runs + 1):
        (temp / f"dcp-invariant-venv-{n}").mkdir()
    call_log, suite_log = files / "calls.log", files / "suite.log"
    preempt_log = files / "preempt.log"

    # The caller's Python, first on PATH, and the one actions/setup-python would set up (off PATH).
    write_shim(shim_dir / "python", "caller")
    setup_python = root / "toolcache" / "python"
    write_shim(setup_python, "setup-python")
    stand_in_outputs = {
        "actions/setup-python": {"python-path": setup_python.as_posix()},
        "actions/attest-build-provenance": {
            "attestation-id": ATTESTATION_ID,
            "attestation-url": ATTESTATION_URL,
        },
    }

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GITHUB_", "RUNNER_", "INPUT_", "DCP_TEST_"))
    }
    env.update(RUNNER)
    env.update(runner)
    env.update(
        {
            "GITHUB_ACTIONS": "true",
            "GITHUB_ACTION_PATH": str(REPO),
            "GITHUB_WORKSPACE": str(workspace),
            "GITHUB_SHA": SHA,
            # Forward slashes, as bash on Windows surely runs programs by such paths.
            "RUNNER_TEMP": temp.as_posix(),
            "PATH": str(shim_dir) + os.pathsep + os.environ.get("PATH", ""),
            # The faked install would have made the package under test importable.
            "PYTHONPATH": os.pathsep.join(
                filter(None, [str(Path(dcp_invariant.__file__).parents[1]), env.get("PYTHONPATH")])
            ),
            # Should a pip get past the shim anyway, it must not reach an index.
            "PIP_NO_INDEX": "1",
            "DCP_TEST_CALL_LOG": call_log.as_posix(),
            "DCP_TEST_SUITE_LOG": suite_log.as_posix(),
            "DCP_TEST_PREEMPT_LOG": preempt_log.as_posix(),
            "DCP_TEST_SUITE_ARTIFACT": str(suite_artifact or files / "no-suite-artifact"),
            "DCP_TEST_SUITE_EXIT": str(suite_exit),
        }
    )
    if externally_managed:
        env["DCP_TEST_EXTERNALLY_MANAGED"] = "1"

    context = Scope({"github": {"sha": SHA}})
    declared = action.get("inputs") or {}
    unknown = set(inputs) - set(declared)
    assert not unknown, f"action.yml declares no input {unknown}"
    context.contexts["inputs"] = {
        name: inputs[name] if name in inputs else context.substitute(spec.get("default", ""))
        for name, spec in declared.items()
    }

    runs: list[StepRun] = []
    for index, step in enumerate(action["runs"]["steps"]):
        extra = set(step) - STEP_KEYS
        if extra:
            raise UnsupportedWorkflow(f"step {index} uses keys the harness ignores: {extra}")
        ran = run_step(index, step, context, env, workspace, files, stand_in_outputs)
        runs.append(ran)
        if ran.outcome == "failure":
            context.failed = True
        if "id" in step:
            outcome = cast(Outcome, ran.outcome)
            context.steps[step["id"]] = StepResult(step["id"], outcome, outcome, ran.outputs)

    outputs = {
        name: context.substitute(spec["value"])
        for name, spec in (action.get("outputs") or {}).items()
    }
    return ActionRun(
        runs,
        outputs,
        workspace,
        temp,
        read_calls(call_log),
        read_log(suite_log),
        read_log(preempt_log),
    )


def run_step(
    index: int,
    step: dict[str, Any],
    context: Scope,
    runner_env: dict[str, str],
    workspace: Path,
    files: Path,
    stand_in_outputs: Mapping[str, dict[str, str]],
) -> StepRun:
    if not context.condition(step.get("if")):
        return StepRun(index, step, "skipped")
    if "uses" in step:
        # Not executed; what it would have been given is kept for the tests, and it "outputs"
        # what its stand-in says (actions/setup-python: the interpreter's path).
        with_ = {k: context.substitute(str(v)) for k, v in (step.get("with") or {}).items()}
        action = step["uses"].split("@")[0]
        return StepRun(
            index, step, "success", with_=with_, outputs=dict(stand_in_outputs.get(action, {}))
        )
    if step.get("shell") != "bash":
        raise UnsupportedWorkflow(f"step {index}: the harness runs only shell: bash")
    if "${{" in step["run"]:
        raise UnsupportedWorkflow(f"step {index}: an expression inside run:")

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
        outputs=parse_command_file(command_files["GITHUB_OUTPUT"].read_text(encoding="utf-8")),
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


# --- the action ------------------------------------------------------------------------------


def test_passing_artifact(tmp_path: Path, data_artifact: Path) -> None:
    run = run_action(tmp_path, suite_artifact=data_artifact, suite_exit=0)

    failures = [(s.index, s.stderr) for s in run.steps if s.outcome == "failure"]
    assert failures == []

    # One uv install into the private environment: torch's CPU build at the default version,
    # numpy as the runtime extra pins it, the package from the action's checkout.
    python = venv_python(run)
    args = run.uv_install
    assert native(option(args, "--python")) == python
    assert f"torch=={runtimes.DEFAULT_TORCH_VERSION}" in args
    assert "numpy==2.4.6" in args
    assert str(REPO) in args
    assert option(args, "--torch-backend") == "cpu"
    assert "--no-config" in args
    # uv compiles no bytecode unless asked; every worker imports torch (see action.yml).
    assert "--compile-bytecode" in args

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
        "valid": "true",
        "problems": "0",
        "manifest-sha256": hashlib.sha256(manifest).hexdigest(),
        "evidence-dir": str(evidence.resolve()),
        "python-path": run.outputs["python-path"],
        "attestation-id": "",  # not asked for
        "attestation-url": "",
    }
    assert native(run.outputs["python-path"]) == python
    assert Path(run.outputs["evidence-dir"]).is_absolute()

    # The default name is unique per matrix job and per attempt.
    name = run.report.outputs["artifact-name"]
    for part in (
        RUNNER["GITHUB_JOB"],
        RUNNER["RUNNER_OS"],
        RUNNER["RUNNER_ARCH"],
        RUNNER["ImageOS"],
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


def test_failing_artifact(tmp_path: Path, rebuild: Rebuild) -> None:
    def promote_the_corrupt_candidate(observations: Observations) -> None:
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
    assert run.suite.outcome == "skipped"
    assert run.suite_log == []
    # Verifying needs no runtime: only the package is installed.
    assert run.install.outcome == "success"
    assert str(REPO) in run.uv_install
    assert not any(a.startswith(("torch", "numpy", "--torch")) for a in run.uv_install)

    assert run.report.outcome == "success"
    assert run.outputs["verdict"] == "fail"
    assert run.using("actions/upload-artifact").outcome == "skipped"
    assert run.gate.outcome == "failure"
    assert run.gate.returncode == 1


def test_invalid_artifact_name_stops_before_anything_is_installed(tmp_path: Path) -> None:
    run = run_action(tmp_path, inputs={"artifact-name": "evidence/run-1"})

    stopped_at_the_inputs(run, "input artifact-name 'evidence/run-1' is not usable: drop ['/']")


# --- the private environment -----------------------------------------------------------------

UV_PIN = re.compile(r"uv==\d+\.\d+\.\d+")


def venv_python(run: ActionRun, n: int = 1, layout: tuple[str, ...] = ("bin", "python")) -> str:
    return native(str(run.temp.joinpath(f"dcp-invariant-venv-{n}", *layout)))


def option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


# What the environment step runs with the Python it starts from, before it makes the
# environment: the version check, then the inputs checked from the action's own checkout.
CHECKS_FIRST = [
    ["-c", "import sys; sys.exit(sys.version_info < (3, 11))"],
    ["-c", INPUTS_CHECK, str(REPO), "action-inputs", "--arguments-file"],
]


def before_the_environment(run: ActionRun, role: str) -> list[Call]:
    """The calls of ``role``'s Python that came before it made the environment, checked to be
    the input check's; the calls after it."""
    calls = [c for c in run.calls if c.role == role]
    assert [c.args[: len(want)] for c, want in zip(calls, CHECKS_FIRST, strict=False)] == (
        CHECKS_FIRST
    ), calls
    return calls[len(CHECKS_FIRST) :]


def test_everything_is_installed_into_a_private_environment_under_runner_temp(
    tmp_path: Path, data_artifact: Path
) -> None:
    run = run_action(tmp_path, suite_artifact=data_artifact)

    assert [s.index for s in run.steps if s.outcome == "failure"] == []
    python = venv_python(run)
    # actions/setup-python sets up the requested Python without putting it on PATH, and that
    # Python only makes the environment.
    setup = run.using("actions/setup-python")
    assert setup.with_ == {"python-version": "3.11", "update-environment": "false"}
    after = before_the_environment(run, "setup-python")
    seeds = [(c.role, *c.args[:-1], native(c.args[-1])) for c in after]
    venv = native(str(Path(python).parents[1]))
    assert seeds == [("setup-python", "-m", "venv", "--system-site-packages", venv)]
    # The caller's Python (first on PATH) is never run, let alone installed into.
    assert [c for c in run.calls if c.role == "caller"] == []

    # Every later step runs the environment's interpreter: uv (pinned, from PyPI) into it, then
    # uv installs into it, then the suite, the report and the gate.
    assert {c.path for c in run.calls if c.role == "venv"} == {python}
    [pip] = run.installs("pip")
    assert [a for a in pip.args if UV_PIN.fullmatch(a)] != []
    assert native(option(run.uv_install, "--python")) == python
    modules = [c.args[1] for c in run.calls if c.args[:1] == ["-m"]]
    assert modules == ["venv", "pip", "uv", "dcp_invariant", "dcp_invariant", "dcp_invariant"]
    ran = [c.args[2] for c in run.calls if c.args[:2] == ["-m", "dcp_invariant"]]
    assert ran == ["run", "github-report", "verify"]
    assert native(run.outputs["python-path"]) == python
    # (run_step asserts no step wrote $GITHUB_ENV or $GITHUB_PATH: later steps are untouched.)


def test_the_callers_environment_gets_dcp_invariant_alone_and_runs_the_check(
    tmp_path: Path, data_artifact: Path
) -> None:
    run = run_action(tmp_path, inputs={"environment": "caller"}, suite_artifact=data_artifact)

    assert [(s.index, s.stderr) for s in run.steps if s.outcome == "failure"] == []
    # No Python is set up: the caller's, first on PATH, is the one checked.
    assert run.using("actions/setup-python").outcome == "skipped"
    caller = native(str(tmp_path / "shim" / "python"))
    assert native(run.outputs["python-path"]) == caller
    # The private environment only lends uv, which installs the package alone into the
    # caller's Python: no torch, no numpy, no dependencies.
    args = run.uv_install
    assert native(option(args, "--python")) == caller
    assert "--no-deps" in args
    assert not [a for a in args if a.startswith(("torch", "numpy"))]
    assert "--torch-backend" not in args
    # The suite, the report and the gate run in the caller's Python.
    ran = [(c.role, c.args[2]) for c in run.calls if c.args[:2] == ["-m", "dcp_invariant"]]
    assert ran == [("caller", "run"), ("caller", "github-report"), ("caller", "verify")]
    assert run.outputs["verdict"] == "pass"


ATTESTATION_ID = "42"
ATTESTATION_URL = "https://github.com/tiramitree/dcp-invariant/attestations/42"


def test_the_evidence_is_not_attested_unless_asked_for(tmp_path: Path, data_artifact: Path) -> None:
    run = run_action(tmp_path, suite_artifact=data_artifact)

    assert run.using("actions/attest-build-provenance").outcome == "skipped"
    assert (run.outputs["attestation-id"], run.outputs["attestation-url"]) == ("", "")
    assert run.outputs["verdict"] == "pass"


def test_attest_true_attests_the_manifest_before_the_gate(
    tmp_path: Path, data_artifact: Path
) -> None:
    inputs = {"attest": "true", "output-dir": "evidence"}
    run = run_action(tmp_path, inputs=inputs, suite_artifact=data_artifact)
    attest = run.using("actions/attest-build-provenance")

    assert attest.outcome == "success"
    # The manifest hashes every file of the artifact: attesting it attests them all.
    assert attest.with_ == {"subject-path": "evidence/manifest.sha256"}
    assert (run.workspace / "evidence" / "manifest.sha256").is_file()
    assert attest.index < run.gate.index
    assert run.outputs["attestation-id"] == ATTESTATION_ID
    assert run.outputs["attestation-url"] == ATTESTATION_URL


def test_no_evidence_no_attestation(tmp_path: Path) -> None:
    run = run_action(tmp_path, inputs={"attest": "true"}, suite_exit=2)

    assert run.using("actions/attest-build-provenance").outcome == "skipped"


def stopped_at_the_inputs(run: ActionRun, line: str) -> None:
    """The environment step failed on ``line``, its one line, before anything was installed
    or run, and every later step that needs it was skipped."""
    failed = [s for s in run.steps if s.outcome == "failure"]
    assert [s.step.get("id") for s in failed] == ["venv"], [s.stderr for s in failed]
    assert failed[0].stderr.splitlines() == [f"dcp-invariant: error: {line}"]
    assert run.installs("pip") == [] and run.installs("uv", "pip") == []
    assert not [c for c in run.calls if c.args[:2] == ["-m", "venv"]]
    assert run.suite_log == []
    assert all(s.outcome == "skipped" for s in run.steps if s.index > failed[0].index)


@pytest.mark.parametrize(
    ("inputs", "line"),
    [
        (
            {"torch-version": "2.13"},
            "input torch-version '2.13' is not a registered release: use one of "
            + ", ".join(runtimes.releases()),
        ),
        ({"environment": "mine"}, "input environment 'mine' is neither 'action' nor 'caller'"),
        ({"attest": "yes"}, "input attest 'yes' is neither 'true' nor 'false'"),
        ({"upload": "1"}, "input upload '1' is neither 'true' nor 'false'"),
        ({"run-suite": "no"}, "input run-suite 'no' is neither 'true' nor 'false'"),
        (
            {"source-revision": "main"},
            "input source-revision 'main' is not a 40-hex commit SHA: leave it out (github.sha) "
            "or give a full SHA",
        ),
        (
            {"retention-days": "0"},
            "input retention-days '0': give a whole number of days, 1 or more, or leave it "
            "empty for the repository's setting",
        ),
        ({"retention-days": "ten"}, "input retention-days 'ten': give a whole number"),
        # A YAML block scalar's trailing line break would split the argument in two.
        ({"fixture": FIXTURE, "steps-before": "3\n"}, "input steps-before '3\\n': give it on "),
        (
            {"fixture": "my_project.checks"},
            "input fixture 'my_project.checks': fixture 'my_project.checks' is not "
            "MODULE:CALLABLE (e.g. my_trainer.checks:make_app)",
        ),
        ({"fixture": FIXTURE, "world-sizes": "1 2"}, "input world-sizes '1 2': --world-sizes"),
        ({"fixture": FIXTURE, "steps-before": "0"}, "input steps-before '0': "),
        ({"fixture": FIXTURE, "steps-after": "--help"}, "input steps-after '--help': "),
        ({"fixture": FIXTURE, "fixture-args": "width"}, "input fixture-args 'width': "),
        ({"fixture": FIXTURE, "rank-local": "a/b"}, "input rank-local 'a/b': "),
        ({"fixture": FIXTURE, "ignore-attr": "model.x"}, "input ignore-attr 'model.x': "),
        (
            {"fixture": FIXTURE, "resume-with-torch": "2.13.0"},
            "input resume-with-torch '2.13.0': --resume-with-torch 2.13.0: that is the installed "
            "torch",
        ),
        (
            {"fixture": FIXTURE, "resume-with-torch": "2.15"},
            "input resume-with-torch '2.15': --resume-with-torch '2.15': not a registered release",
        ),
        ({"world-sizes": "1,2"}, "input world-sizes '1,2': --world-sizes go with --fixture"),
        (
            {"output-dir": "kept"},
            "input output-dir 'kept': kept already exists and is not an empty directory",
        ),
    ],
)
def test_a_bad_input_stops_before_anything_is_installed(
    tmp_path: Path, inputs: dict[str, str], line: str
) -> None:
    def prepare(workspace: Path) -> None:
        (workspace / "kept").mkdir()
        (workspace / "kept" / "evidence.json").write_text("{}", encoding="utf-8")

    run = run_action(tmp_path, inputs=inputs, prepare=prepare)

    failed = [s for s in run.steps if s.outcome == "failure"]
    assert failed and failed[0].stderr.startswith(f"dcp-invariant: error: {line}"), [
        s.stderr for s in failed
    ]
    stopped_at_the_inputs(
        run, failed[0].stderr.splitlines()[0].removeprefix("dcp-invariant: error: ")
    )


def test_booleans_are_read_as_github_reads_them(tmp_path: Path, data_artifact: Path) -> None:
    """GitHub's `if:` compares case-insensitively: 'True' runs the suite, and the install its
    suite needs runs too (a shell comparing it as given would have skipped torch)."""
    run = run_action(
        tmp_path,
        inputs={"run-suite": "True", "upload": "FALSE", "environment": "Action"},
        suite_artifact=data_artifact,
    )

    assert [s.index for s in run.steps if s.outcome == "failure"] == []
    assert [a for a in run.uv_install if a.startswith("torch==")] == ["torch==2.13.0"]
    assert run.suite_log == [BASE_ARGS]
    assert run.using("actions/upload-artifact").outcome == "skipped"
    assert run.outputs["verdict"] == "pass"


def test_empty_python_version_works_on_an_externally_managed_python(
    tmp_path: Path, data_artifact: Path
) -> None:
    run = run_action(
        tmp_path,
        inputs={"python-version": ""},
        suite_artifact=data_artifact,
        externally_managed=True,
    )

    assert [(s.index, s.stderr) for s in run.steps if s.outcome == "failure"] == []
    assert run.using("actions/setup-python").outcome == "skipped"
    # The Python on PATH only makes the environment (venv works on a PEP 668 Python; pip install
    # into it would not), and everything is installed into that environment.
    caller = before_the_environment(run, "caller")
    assert [(c.role, c.args[:3]) for c in caller] == [
        ("caller", ["-m", "venv", "--system-site-packages"])
    ]
    assert {c.path for c in run.installs("pip")} == {venv_python(run)}
    assert run.outputs["verdict"] == "pass"

    # The stand-in does refuse, so installing into the caller's Python would have failed here.
    refused = subprocess.run(
        ["bash", str(tmp_path / "shim" / "python"), "-m", "pip", "install", "numpy==2.4.6"],
        env={
            **os.environ,
            "DCP_TEST_CALL_LOG": str(tmp_path / "files" / "refused.log"),
            "DCP_TEST_EXTERNALLY_MANAGED": "1",
        },
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode != 0
    assert "externally-managed-environment" in refused.stderr


@pytest.mark.parametrize(
    ("runner_os", "layout", "cpu_index"),
    [
        ("Linux", ("bin", "python"), True),
        ("Windows", ("Scripts", "python.exe"), True),
        # PyPI's macOS torch is the CPU build.
        ("macOS", ("bin", "python"), False),
    ],
)
def test_each_os_gets_its_interpreter_path_and_the_cpu_build(
    tmp_path: Path,
    data_artifact: Path,
    runner_os: str,
    layout: tuple[str, ...],
    cpu_index: bool,
) -> None:
    if runner_os == "Windows" and sys.platform == "win32":
        pytest.skip("the stand-in python.exe is a bash script, which Windows will not execute")
    run = run_action(tmp_path, suite_artifact=data_artifact, runner={"RUNNER_OS": runner_os})

    assert run.gate.outcome == "success", run.gate.stderr
    python = venv_python(run, layout=layout)
    assert {c.path for c in run.calls if c.role == "venv"} == {python}
    args = run.uv_install
    assert f"torch=={runtimes.DEFAULT_TORCH_VERSION}" in args
    if cpu_index:
        # uv sends torch, and only PyTorch's packages, to PyTorch's CPU index.
        assert option(args, "--torch-backend") == "cpu"
    else:
        assert "--torch-backend" not in args
        assert "--index-url" not in args


def test_a_second_use_in_a_job_gets_its_own_environment(
    tmp_path: Path, data_artifact: Path
) -> None:
    run = run_action(tmp_path, suite_artifact=data_artifact, earlier_runs=1)

    assert run.gate.outcome == "success"
    # The first one's python-path output still names an environment nobody rewrote.
    assert native(run.outputs["python-path"]) == venv_python(run, 2)
    assert list((run.temp / "dcp-invariant-venv-1").iterdir()) == []
    # Its upload must not collide with the first one's: upload-artifact refuses a used name.
    (tmp_path / "first").mkdir()
    first = run_action(tmp_path / "first", suite_artifact=data_artifact)
    second = run.using("actions/upload-artifact").with_["name"]
    assert second == first.using("actions/upload-artifact").with_["name"] + "-use2"


# --- nothing to upload ------------------------------------------------------------------------


def test_a_suite_that_wrote_nothing_skips_the_upload(tmp_path: Path) -> None:
    # A refused runtime, say: the suite exits 2 and writes nothing.
    run = run_action(tmp_path, suite_artifact=None, suite_exit=2)

    assert run.suite.outcome == "failure"
    assert not (run.workspace / "dcp-invariant-evidence").exists()
    assert run.report.outcome == "success"
    assert run.report.outputs["has-evidence"] == "false"
    assert run.outputs["verdict"] == "fail"
    assert run.using("actions/upload-artifact").outcome == "skipped"
    assert run.gate.outcome == "failure"


def test_an_empty_output_dir_is_not_uploaded(tmp_path: Path) -> None:
    run = run_action(
        tmp_path,
        inputs={"run-suite": "false", "output-dir": "empty"},
        prepare=lambda workspace: (workspace / "empty").mkdir(),
    )

    assert run.report.outputs["has-evidence"] == "false"
    assert run.using("actions/upload-artifact").outcome == "skipped"
    assert run.gate.outcome == "failure"


def test_written_evidence_is_uploaded_even_when_the_suite_failed(
    tmp_path: Path, data_artifact: Path
) -> None:
    run = run_action(tmp_path, suite_artifact=data_artifact, suite_exit=1)

    assert run.suite.outcome == "failure"
    assert run.report.outputs["has-evidence"] == "true"
    assert run.using("actions/upload-artifact").outcome == "success"


# --- a fixture run ---------------------------------------------------------------------------
#
# The shim copies the registered artifact for these too: what is tested is the command line the
# suite step builds and where it runs, not a fixture run's evidence.


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


def test_fixture_args_and_rank_local_become_one_flag_each(
    tmp_path: Path, data_artifact: Path
) -> None:
    run = run_action(
        tmp_path,
        inputs={
            "fixture": FIXTURE,
            # A YAML block scalar as a workflow writes it: CRLF from a Windows editor, a blank
            # line, a value with spaces and shell syntax that must stay one argument.
            "fixture-args": 'width=64\r\n\nname="tiny $(touch pwned)"\nlayers=[1, 2]\n',
            "rank-local": "data, loader ,",
            "ignore-attr": " app.ema,rng.numpy",
        },
        suite_artifact=data_artifact,
        prepare=caller_checkout,
    )

    assert run.suite.outcome == "success", run.suite.stderr
    assert run.suite_log == [
        [
            *BASE_ARGS,
            "--fixture",
            FIXTURE,
            "--fixture-arg",
            "width=64",
            "--fixture-arg",
            'name="tiny $(touch pwned)"',
            "--fixture-arg",
            "layers=[1, 2]",
            "--rank-local",
            "data",
            "--rank-local",
            "loader",
            "--ignore-attr",
            "app.ema",
            "--ignore-attr",
            "rng.numpy",
        ]
    ]
    assert not (run.workspace / "pwned").exists()


def test_fixture_inputs_are_single_arguments_never_shell(
    tmp_path: Path, data_artifact: Path
) -> None:
    """What a shell would run is one argument of run's, and refused as such."""
    hostile = {
        "fixture": FIXTURE,
        "fixture-args": 'name="tiny $(touch pwned)"; touch pwned',
        "rank-local": "`touch pwned`",
    }
    run = run_action(tmp_path, inputs=hostile, suite_artifact=data_artifact)

    stopped_at_the_inputs(
        run,
        "input rank-local '`touch pwned`': --rank-local '`touchpwned`': give a top-level key "
        "of the app's state_dict(), e.g. --rank-local data",
    )
    assert not (run.workspace / "pwned").exists()


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
    # Nothing was written, so nothing is uploaded (no second "No files were found" failure).
    assert run.using("actions/upload-artifact").outcome == "skipped"
    assert run.gate.outcome == "failure"


# --- preempt-command: the caller's own job, instead of the suite -----------------------------
#
# The shim runs no job: what is tested is that the command reaches preempt as the arguments
# shlex makes of it, through no shell, with the environment's python first on PATH, and that the
# report, the upload, the attestation and the gate take preempt's evidence.

# The input check runs on the runner, and refuses preempt off Linux (the last test here).
ON_LINUX = pytest.mark.skipif(sys.platform != "linux", reason="preempt runs on Linux runners only")

# A shell would run `touch pwned` four ways here, and expand $HOME and the glob; an empty
# argument, one with spaces at its ends and one with a backslash must arrive as they are.
HOSTILE_COMMAND = (
    "python train.py --out {run_dir} --name 'tiny $(touch pwned)' \"`touch pwned`\" "
    '; touch pwned | tee pwned && $HOME * --tag="it\'s"'
    r" '' '  spaced  ' 'a\nb'"
)


def preempt_record(passing: bool) -> dict[str, Any]:
    """A preempt record that verifies, built as tests/evidence/test_preempt_record.py builds
    its own (so it follows the record's format): two of its crash points fail; ``passing``
    keeps only the two that pass."""
    import importlib.util

    path = REPO / "tests" / "evidence" / "test_preempt_record.py"
    spec = importlib.util.spec_from_file_location("_preempt_record_builder", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    made = cast(dict[str, Any], module.a_record())
    if passing:
        made["relaunches"] = [r for r in made["relaunches"] if not r["reasons"]]
    return made


def prepared_preempt_evidence(root: Path, passing: bool = True) -> Path:
    from dcp_invariant.evidence.preempt import record

    directory = root / "prepared-preempt"
    record.write(directory, preempt_record(passing))
    return directory


@pytest.fixture(params=[True, False], ids=["passing", "failing"])
def preempt_evidence(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, bool]:
    passing = cast(bool, request.param)
    return prepared_preempt_evidence(tmp_path, passing), passing


def preempt_inputs(**more: str) -> dict[str, str]:
    return {"preempt-command": HOSTILE_COMMAND, **more}


@ON_LINUX
def test_preempt_command_reaches_preempt_as_its_words_never_through_a_shell(
    tmp_path: Path, preempt_evidence: tuple[Path, bool]
) -> None:
    evidence, passing = preempt_evidence
    run = run_action(
        tmp_path,
        inputs=preempt_inputs(),
        suite_artifact=evidence,
        suite_exit=0 if passing else 1,
    )

    # Instead of the suite, in the check step.
    assert run.suite_log == []
    assert run.preempt.outcome == ("success" if passing else "failure"), run.preempt.stderr
    [(python_on_path, *arguments)] = run.preempt_log
    assert arguments == ["--output-dir=dcp-invariant-evidence", "--", *shlex.split(HOSTILE_COMMAND)]
    assert "tiny $(touch pwned)" in arguments and "`touch pwned`" in arguments
    assert arguments[-3:] == ["", "  spaced  ", r"a\nb"]
    assert not list(tmp_path.rglob("pwned"))  # nothing ran it
    # The job's python is the action's environment's, where torch was installed for it.
    assert native(python_on_path) == venv_python(run)
    assert f"torch=={runtimes.DEFAULT_TORCH_VERSION}" in run.uv_install

    # The report counts crash points, as verify derives them from preempt.json.
    written = run.workspace / "dcp-invariant-evidence" / "preempt.json"
    assert run.outputs["verdict"] == ("pass" if passing else "fail")
    assert (run.outputs["passed"], run.outputs["failed"]) == (("2", "0") if passing else ("2", "2"))
    assert (run.outputs["valid"], run.outputs["problems"]) == ("true", "0")
    assert run.outputs["manifest-sha256"] == hashlib.sha256(written.read_bytes()).hexdigest()
    headline = run.summary.splitlines()[0]
    if passing:
        assert headline == "## dcp-invariant preempt: pass: 2 crash points passed, 0 failed"
    else:
        assert headline == "## dcp-invariant preempt: fail: 2 crash points passed, 2 failed"
        assert [line for line in run.summary.splitlines() if line.startswith("- FAIL ")]
    # Uploaded whatever its verdict; the gate is verify's, on preempt.json.
    upload = run.using("actions/upload-artifact")
    assert upload.outcome == "success" and upload.with_["path"] == "dcp-invariant-evidence"
    assert run.gate.outcome == ("success" if passing else "failure"), run.gate.stdout
    assert run.gate.stdout.splitlines()[-1].startswith("pass: " if passing else "fail: ")


@ON_LINUX
def test_preempts_options_reach_it_one_argument_each(tmp_path: Path) -> None:
    step_line = r"it (?P<step>\d+) loss (?P<loss>\S+)"
    run = run_action(
        tmp_path,
        inputs={
            "preempt-command": "torchrun --nproc-per-node 2 train.py {run_dir}",
            "preempt-final": "final dir/model.safetensors",
            "preempt-step-line": step_line,
            "preempt-crash-points": "8",
            "output-dir": "preempt evidence",
        },
    )

    [(_, *arguments)] = run.preempt_log
    assert arguments == [
        "--output-dir=preempt evidence", "--final=final dir/model.safetensors",
        f"--step-line={step_line}", "--crash-points=8", "--", "torchrun", "--nproc-per-node", "2",
        "train.py", "{run_dir}",
    ]  # fmt: skip


@ON_LINUX
def test_preempt_in_the_callers_environment_finds_the_callers_python(tmp_path: Path) -> None:
    run = run_action(
        tmp_path,
        inputs=preempt_inputs(environment="caller"),
        suite_artifact=prepared_preempt_evidence(tmp_path),
    )

    [(python_on_path, *_)] = run.preempt_log
    assert native(python_on_path) == native(str(tmp_path / "shim" / "python"))
    # Nothing over the caller's packages: the job runs on its own torch.
    assert "--no-deps" in run.uv_install
    assert not [a for a in run.uv_install if a.startswith(("torch", "numpy"))]
    assert run.gate.outcome == "success"


@ON_LINUX
def test_attest_true_attests_preempt_json(tmp_path: Path) -> None:
    run = run_action(
        tmp_path,
        inputs=preempt_inputs(attest="true", **{"output-dir": "evidence"}),
        suite_artifact=prepared_preempt_evidence(tmp_path),
    )

    attest = run.using("actions/attest-build-provenance")
    assert attest.outcome == "success"
    # Its one file names the whole evidence, as the suite's manifest does.
    assert attest.with_ == {"subject-path": "evidence/preempt.json"}
    assert (run.workspace / "evidence" / "preempt.json").is_file()


@ON_LINUX
@pytest.mark.parametrize(
    ("inputs", "line"),
    [
        (
            {"preempt-command": "python train.py --out '$(touch pwned)"},
            'input preempt-command "python train.py --out \'$(touch pwned)": no closing '
            "quotation: it is split as a shell splits words (shlex), and never given to one",
        ),
        (
            {"preempt-command": "python train.py; touch pwned"},
            "input preempt-command 'python train.py; touch pwned' has no {run_dir}: ",
        ),
        (
            {"preempt-command": HOSTILE_COMMAND, "fixture": FIXTURE},
            f"input fixture '{FIXTURE}' goes with the suite, and preempt-command runs your own "
            "job instead: give one of them (use the action twice for both)",
        ),
        (
            {"preempt-command": HOSTILE_COMMAND, "run-suite": "false"},
            "input run-suite 'false' only verifies output-dir, and preempt-command runs a check",
        ),
        (
            {"preempt-crash-points": "8"},
            "input preempt-crash-points '8' goes with preempt-command, which is empty",
        ),
        (
            {"preempt-command": HOSTILE_COMMAND, "preempt-final": "/abs/final.pt"},
            "input preempt-final '/abs/final.pt': --final '/abs/final.pt' is not a path inside "
            "{run_dir}",
        ),
    ],
)
def test_a_bad_preempt_input_stops_before_anything_is_installed(
    tmp_path: Path, inputs: dict[str, str], line: str
) -> None:
    run = run_action(tmp_path, inputs=inputs)

    failed = [s for s in run.steps if s.outcome == "failure"]
    assert failed and failed[0].stderr.startswith(f"dcp-invariant: error: {line}"), [
        s.stderr for s in failed
    ]
    stopped_at_the_inputs(
        run, failed[0].stderr.splitlines()[0].removeprefix("dcp-invariant: error: ")
    )
    assert run.preempt_log == []
    assert not list(tmp_path.rglob("pwned"))


@ON_LINUX
def test_tampered_preempt_evidence_is_invalid_and_fails_the_gate(tmp_path: Path) -> None:
    evidence = prepared_preempt_evidence(tmp_path, passing=False)
    written = evidence / "preempt.json"
    # A failed crash point's reasons dropped: verify derives them again and finds them gone.
    written.write_bytes(written.read_bytes().replace(b'"reasons":["cannot', b'"reasons":["could'))
    run = run_action(tmp_path, inputs=preempt_inputs(), suite_artifact=evidence)

    assert run.outputs["verdict"] == "fail"
    assert run.outputs["valid"] == "false" and int(run.outputs["problems"]) >= 1
    assert run.summary.startswith("## dcp-invariant invalid preempt evidence (")
    assert run.gate.outcome == "failure"


@pytest.mark.skipif(sys.platform == "linux", reason="the refusal off Linux")
def test_preempt_off_linux_stops_before_anything_is_installed(tmp_path: Path) -> None:
    run = run_action(tmp_path, inputs=preempt_inputs())

    stopped_at_the_inputs(
        run,
        f"input preempt-command: preempt runs on Linux only (this runner is {sys.platform}): "
        "it hears the job's file operations through LD_PRELOAD; run it on a Linux runner",
    )
