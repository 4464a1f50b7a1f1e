"""A GitHub Actions runner for this repository's workflow, on this Linux machine.

It reads ``.github/workflows/ci.yml``, expands each job's matrix, and runs every step of every
``ubuntu-*`` job as a hosted runner would: ``run:`` scripts exactly as written, with
``bash --noprofile --norc -eo pipefail``, the job's and the step's ``env:``, their working
directory, and fresh ``$GITHUB_OUTPUT``, ``$GITHUB_ENV``, ``$GITHUB_PATH`` and
``$GITHUB_STEP_SUMMARY`` files, under a ``$RUNNER_TEMP`` of the job's own. ``uses: ./`` runs the
composite action's own steps from the checkout (``action.yml``) the same way.

The three remote actions the workflow uses are stood in for by what they do to the job:

- ``actions/checkout``: the repository's files (tracked, and new ones not ignored) copied into
  the workspace;
- ``actions/setup-python``: a CPython of that minor version made for the job from an
  interpreter on this machine, with an empty ``site-packages`` (pip only), put first on
  ``PATH`` unless ``update-environment`` is ``false``: it holds only what the job installs;
- ``actions/upload-artifact``: the files copied aside, refusing a name the run already used
  and an empty path, as ``if-no-files-found: error`` and upload-artifact v4 and later do.

``PATH`` starts with the image's Python as ``python3`` and ``python``: CPython 3.12 with an
``EXTERNALLY-MANAGED`` marker, as on ubuntu-24.04. Expressions are parsed, not pattern-matched;
an expression, step key or action this runner does not model raises
:class:`UnsupportedWorkflow`, so it cannot approve what it does not understand.

Jobs on other runners (windows-*, macos-*) are not run. Their steps are still evaluated: each is
reported as covered (the same script, inputs and environment ran in a Linux job) or as needing
that OS.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

REPOSITORY = "tiramitree/dcp-invariant"
SHA = "0123456789abcdef0123456789abcdef01234567"
IMAGE_PYTHON = "3.12"  # ubuntu-24.04's python3
PYENV_VERSIONS = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")) / "versions"
STEP_KEYS = {
    "name",
    "id",
    "if",
    "uses",
    "with",
    "shell",
    "env",
    "run",
    "working-directory",
    "continue-on-error",
    "timeout-minutes",
}
# Variables of the machine's session that a fresh runner would not have.
SESSION_VARIABLES = (
    "GITHUB_",
    "RUNNER_",
    "INPUT_",
    "VIRTUAL_ENV",
    "PYTHON",  # PYTHONPATH, PYTHONDONTWRITEBYTECODE, ...: this machine's, not a runner's
    "PYTEST_",
    "PYENV_VERSION",
    "UV_",  # how .ci/run points uv at this machine's wheels: a runner's uv has no such settings
)

Outcome = Literal["success", "failure", "skipped"]


class UnsupportedWorkflow(AssertionError):
    """The workflow uses something this runner does not model: extend it deliberately."""


def load_yaml(path: Path) -> Any:
    # Imported here: ruamel.yaml comes with the `test` extra, which the live job lacks while
    # still collecting the modules that import this one.
    from ruamel.yaml import YAML

    return YAML(typ="safe").load(path.read_text(encoding="utf-8"))


# --- expressions -----------------------------------------------------------------------------

_TOKEN = re.compile(
    r"\s*(?:(?P<op>&&|\|\||==|!=|!|\(|\))|'(?P<str>(?:[^']|'')*)'"
    r"|(?P<name>[A-Za-z_][\w-]*(?:\.[\w-]+)*(?:\(\))?))"
)
STATUS_FUNCTIONS = ("success()", "failure()", "always()", "cancelled()")
Value = str | bool


@dataclass
class Scope:
    """What expressions can read: contexts by name, and each earlier step by id."""

    contexts: dict[str, dict[str, str]]
    steps: dict[str, StepResult] = field(default_factory=dict)
    failed: bool = False  # whether an earlier step failed (what success() checks)

    def lookup(self, name: str) -> Value:
        if name in STATUS_FUNCTIONS:
            return {
                "success()": not self.failed,
                "failure()": self.failed,
                "always()": True,
                "cancelled()": False,  # nothing is cancelled here
            }[name]
        head, _, rest = name.partition(".")
        if head == "steps":
            step_id, _, what = rest.partition(".")
            if step_id not in self.steps:
                raise UnsupportedWorkflow(f"{name!r}: no earlier step has id {step_id!r}")
            step = self.steps[step_id]
            if what in ("outcome", "conclusion"):
                return step.outcome if what == "outcome" else step.conclusion
            if what.startswith("outputs."):
                # GitHub yields an empty string for an output the step did not set.
                return step.outputs.get(what.removeprefix("outputs."), "")
            raise UnsupportedWorkflow(name)
        if head in self.contexts and rest in self.contexts[head]:
            return self.contexts[head][rest]
        raise UnsupportedWorkflow(f"unknown name {name!r}")

    def evaluate(self, expression: str) -> Value:
        tokens = _tokens(expression)
        value, end = self._or(tokens, 0)
        if end != len(tokens):
            raise UnsupportedWorkflow(f"cannot parse {expression!r}")
        return value

    def _or(self, tokens: list[tuple[str, str]], i: int) -> tuple[Value, int]:
        value, i = self._and(tokens, i)
        while i < len(tokens) and tokens[i] == ("op", "||"):
            right, i = self._and(tokens, i + 1)
            value = value if truthy(value) else right
        return value, i

    def _and(self, tokens: list[tuple[str, str]], i: int) -> tuple[Value, int]:
        value, i = self._not(tokens, i)
        while i < len(tokens) and tokens[i] == ("op", "&&"):
            right, i = self._not(tokens, i + 1)
            value = right if truthy(value) else value
        return value, i

    def _not(self, tokens: list[tuple[str, str]], i: int) -> tuple[Value, int]:
        if i < len(tokens) and tokens[i] == ("op", "!"):
            value, i = self._not(tokens, i + 1)
            return not truthy(value), i
        left, i = self._atom(tokens, i)
        if i < len(tokens) and tokens[i] in (("op", "=="), ("op", "!=")):
            op = tokens[i][1]
            right, i = self._atom(tokens, i + 1)
            if not (isinstance(left, str) and isinstance(right, str)):
                raise UnsupportedWorkflow(f"comparison of {left!r} and {right!r}")
            # GitHub compares strings ignoring case.
            equal = left.casefold() == right.casefold()
            return equal if op == "==" else not equal, i
        return left, i

    def _atom(self, tokens: list[tuple[str, str]], i: int) -> tuple[Value, int]:
        if i >= len(tokens):
            raise UnsupportedWorkflow("an expression ends early")
        kind, text = tokens[i]
        if (kind, text) == ("op", "("):
            value, i = self._or(tokens, i + 1)
            if i >= len(tokens) or tokens[i] != ("op", ")"):
                raise UnsupportedWorkflow("unbalanced parentheses")
            return value, i + 1
        if kind == "str":
            return text.replace("''", "'"), i + 1
        if kind == "name":
            if text in ("true", "false"):
                return text == "true", i + 1
            return self.lookup(text), i + 1
        raise UnsupportedWorkflow(f"unexpected {text!r}")

    def substitute(self, text: Any) -> str:
        """Replace each ``${{ ... }}`` in a value (env:, with:, names, an input's default)."""
        if isinstance(text, bool):
            return "true" if text else "false"
        if isinstance(text, int | float):
            return str(text)
        if not isinstance(text, str):
            raise UnsupportedWorkflow(f"non-string value {text!r}")
        return re.sub(r"\$\{\{(.*?)\}\}", lambda m: render(self.evaluate(m[1])), text)

    def condition(self, text: Any) -> bool:
        """An ``if:``; without a status function GitHub adds an implicit ``success() &&``."""
        text = "" if text is None else str(text).strip()
        if match := re.fullmatch(r"\$\{\{(.*)\}\}", text, re.DOTALL):
            text = match[1].strip()
        if not text:
            return not self.failed
        value = truthy(self.evaluate(text))
        if not any(f in text for f in STATUS_FUNCTIONS):
            value = value and not self.failed
        return value


def _tokens(expression: str) -> list[tuple[str, str]]:
    tokens, i = [], 0
    expression = expression.strip()
    while i < len(expression):
        match = _TOKEN.match(expression, i)
        if not match or match.end() == i:
            raise UnsupportedWorkflow(f"cannot parse {expression!r} at {expression[i:]!r}")
        kind = match.lastgroup
        assert kind is not None
        tokens.append((kind, match[kind]))
        i = match.end()
        while i < len(expression) and expression[i].isspace():
            i += 1
    return tokens


def truthy(value: Value) -> bool:
    return value if isinstance(value, bool) else value != ""


def render(value: Value) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else value


# --- command files ---------------------------------------------------------------------------


def parse_command_file(text: str) -> dict[str, str]:
    """$GITHUB_OUTPUT and $GITHUB_ENV: ``key=value`` lines and ``key<<DELIMITER`` blocks."""
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
                raise AssertionError(f"{key}: no closing {delimiter!r}")
            values[key] = "\n".join(body)
        elif line:
            key, value = line.split("=", 1)
            values[key] = value
    return values


# --- results ---------------------------------------------------------------------------------


@dataclass
class StepResult:
    name: str
    outcome: Outcome
    conclusion: Outcome  # success where continue-on-error hid a failure
    outputs: dict[str, str] = field(default_factory=dict)
    log: str = ""  # what the step printed (stdout and stderr, interleaved)
    note: str = ""  # what a stand-in did, or why a step was skipped
    inner: list[StepResult] = field(default_factory=list)  # a composite action's steps
    seconds: float = 0.0


@dataclass
class JobResult:
    name: str
    runs_on: str
    steps: list[StepResult] = field(default_factory=list)
    skipped: str = ""  # why the whole job did not run here
    substituted: str = ""  # matrix values it ran with instead of the written ones
    overrides: dict[str, str] = field(default_factory=dict)
    summary: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.skipped and all(s.conclusion != "failure" for s in self.steps)

    def report(self) -> str:
        """One line per step, composite actions' steps indented under them."""
        lines = [f"{self.name}: {'skipped: ' + self.skipped if self.skipped else self.verdict}"]
        if self.substituted:
            lines.append(f"  ran with {self.substituted}: this machine has no wheel of it")

        def walk(steps: list[StepResult], depth: int) -> None:
            for s in steps:
                extra = f" ({s.note})" if s.note else ""
                lines.append(f"{'  ' * depth}- {s.name}: {s.outcome}{extra} [{s.seconds:.0f} s]")
                walk(s.inner, depth + 1)

        walk(self.steps, 1)
        return "\n".join(lines)

    @property
    def verdict(self) -> str:
        return "passed" if self.passed else "failed"

    def failures(self, tail: int = 6000) -> str:
        """The log of each failed step, its last ``tail`` characters."""
        out = []

        def walk(steps: list[StepResult], where: str) -> None:
            for s in steps:
                if s.outcome == "failure" and not s.inner:
                    out.append(f"--- {where}{s.name} ---\n{s.log[-tail:]}")
                walk(s.inner, f"{where}{s.name} / ")

        walk(self.steps, f"{self.name} / ")
        return "\n".join(out)


# --- the machine's Pythons -------------------------------------------------------------------


def installed_python(version: str) -> Path | None:
    """The newest pyenv CPython ``version`` (``3.12``) on this machine, its prefix."""
    found = sorted(
        PYENV_VERSIONS.glob(f"{version}.*"),
        key=lambda p: [int(x) if x.isdigit() else -1 for x in p.name.split(".")],
    )
    return found[-1] if found else None


def fresh_python(version: str, destination: Path, *, externally_managed: bool = False) -> Path:
    """A CPython ``version`` whose ``site-packages`` holds pip alone: its interpreter.

    The machine's interpreters carry packages of their own, which a venv made with
    ``--system-site-packages`` (the action's) would see. Here the standard library is linked
    and the interpreter copied (its prefix is where it lies), so ``site-packages`` is new.
    """
    prefix = installed_python(version)
    if prefix is None:
        raise FileNotFoundError(f"no CPython {version} on this machine")
    stdlib = f"python{version}"
    (destination / "bin").mkdir(parents=True)
    lib = destination / "lib" / stdlib
    lib.mkdir(parents=True)
    for entry in (prefix / "lib" / stdlib).iterdir():
        if entry.name != "site-packages":
            (lib / entry.name).symlink_to(entry)
    for entry in (prefix / "lib").iterdir():
        if entry.name.startswith("libpython"):
            (destination / "lib" / entry.name).symlink_to(entry)
    (lib / "site-packages").mkdir()
    interpreter = destination / "bin" / stdlib
    # Copied by cp, not by this process: jobs run in threads, and a child forked by another
    # thread while this process held the copy open for writing would keep that descriptor, so
    # running the copy would fail with ETXTBSY ("Text file busy").
    subprocess.run(
        ["cp", "-p", str(prefix / "bin" / stdlib), str(interpreter)], timeout=60, check=True
    )
    for alias in ("python3", "python"):
        (destination / "bin" / alias).symlink_to(stdlib)
    subprocess.run(
        [str(interpreter), "-m", "ensurepip", "--default-pip"],
        capture_output=True,
        timeout=300,
        check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith(SESSION_VARIABLES)},
    )
    if externally_managed:
        (lib / "EXTERNALLY-MANAGED").write_text(
            "[externally-managed]\nError=This Python is the image's own (PEP 668).\n"
        )
    return interpreter


# --- the runner ------------------------------------------------------------------------------


@dataclass
class Job:
    """One job of the workflow, its matrix expanded."""

    key: str
    name: str
    runs_on: str
    matrix: dict[str, str]
    spec: dict[str, Any]

    @property
    def on_linux(self) -> bool:
        return self.runs_on.startswith("ubuntu-")

    @property
    def os_name(self) -> str:
        return {"ubuntu": "Linux", "windows": "Windows", "macos": "macOS"}[
            self.runs_on.split("-")[0]
        ]


def expand(workflow: dict[str, Any]) -> list[Job]:
    jobs = []
    for key, spec in workflow["jobs"].items():
        strategy = spec.get("strategy") or {}
        matrix = dict(strategy.get("matrix") or {})
        if set(matrix) & {"include", "exclude"}:
            raise UnsupportedWorkflow(f"{key}: matrix include/exclude")
        names = list(matrix)
        for values in itertools.product(*(matrix[n] for n in names)) if names else [()]:
            entry = {n: str(v) for n, v in zip(names, values, strict=True)}
            scope = Scope({"matrix": entry})
            jobs.append(
                Job(
                    key,
                    scope.substitute(spec.get("name", key)),
                    scope.substitute(spec["runs-on"]),
                    entry,
                    spec,
                )
            )
    return jobs


class Uploads:
    """Artifact names a workflow run has used: upload-artifact refuses a second one."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._lock = threading.Lock()
        self.names: list[str] = []

    def add(self, name: str, source: Path) -> str:
        with self._lock:
            if not name:
                return "failure: an artifact needs a name"
            if name in self.names:
                return f"failure: an artifact named {name!r} was already uploaded in this run"
            if not source.exists() or (source.is_dir() and not any(source.iterdir())):
                return f"failure: no files were found at {source} (if-no-files-found: error)"
            self.names.append(name)
        if source.is_dir():
            shutil.copytree(source, self.directory / name)
        else:
            (self.directory / name).mkdir()
            shutil.copy2(source, self.directory / name)
        return f"uploaded {name}"


@dataclass
class Runner:
    """Runs jobs of one workflow from ``repository``; each job works under ``root/<n>``."""

    repository: Path
    root: Path
    environment: Mapping[str, str] = field(default_factory=dict)  # the network, for every job
    ref: str = "refs/heads/main"  # what triggered the run: a push to main, or a tag
    workflow: str = "ci"
    # Steps that another job of this session runs on the same tree, by their ``run:`` text, and
    # which one: each is skipped with that note, as its result would repeat the other's.
    covered: Mapping[str, str] = field(default_factory=dict)
    uploads: Uploads = field(init=False)
    _count: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        self.uploads = Uploads(self.root / "artifacts")
        self.uploads.directory.mkdir(parents=True, exist_ok=True)

    def run(
        self,
        job: Job,
        skip: Callable[[Job], str] = lambda job: "",
        overrides: Mapping[str, str] = {},
    ) -> JobResult:
        """Run ``job``; ``overrides`` replaces matrix values the machine cannot honour, and the
        result says so."""
        result = JobResult(job.name, job.runs_on)
        if overrides:
            result.overrides = dict(overrides)
            result.substituted = ", ".join(
                f"matrix.{k} {v} instead of {job.matrix[k]}" for k, v in overrides.items()
            )
            job = dataclasses.replace(job, matrix={**job.matrix, **overrides})
        reason = skip(job) or ("" if job.on_linux else f"needs {job.runs_on}")
        if not reason and installed_python(IMAGE_PYTHON) is None:
            reason = f"no CPython {IMAGE_PYTHON} on this machine for the image's own Python"
        if reason:
            result.skipped = reason
            return result
        started = time.monotonic()
        home = self.root / f"job{next(self._count)}"
        workspace, temp, tools, image = (
            home / d for d in ("workspace", "temp", "toolcache", "image")
        )
        for d in (workspace, temp, tools):
            d.mkdir(parents=True)
        fresh_python(IMAGE_PYTHON, image, externally_managed=True)
        deadline = started + 60 * float(job.spec.get("timeout-minutes", 360))
        env = _base_environment()
        env.update(self.environment)
        env.update(
            {
                "CI": "true",
                "GITHUB_ACTIONS": "true",
                "GITHUB_JOB": job.key,
                "GITHUB_REPOSITORY": REPOSITORY,
                "GITHUB_REF": self.ref,
                "GITHUB_REF_NAME": self.ref.rsplit("/", 1)[-1],
                "GITHUB_RUN_ATTEMPT": "1",
                "GITHUB_RUN_ID": "1",
                "GITHUB_SHA": SHA,
                "GITHUB_WORKFLOW": self.workflow,
                "GITHUB_WORKSPACE": str(workspace),
                "ImageOS": "ubuntu24",
                "RUNNER_ARCH": "X64",
                "RUNNER_OS": job.os_name,
                "RUNNER_TEMP": str(temp),
                "RUNNER_TOOL_CACHE": str(tools),
                "PATH": os.pathsep.join([str(image / "bin"), env["PATH"]]),
            }
        )
        contexts = {
            "matrix": job.matrix,
            "runner": {"os": job.os_name, "arch": "X64", "temp": str(temp)},
            "github": {
                "sha": SHA,
                "workflow": self.workflow,
                "ref": self.ref,
                "ref_name": self.ref.rsplit("/", 1)[-1],
                "workspace": str(workspace),
                "repository": REPOSITORY,
                "job": job.key,
            },
        }
        run = _JobRun(self, workspace, env, deadline, job.spec.get("defaults") or {})
        env.update(
            {k: Scope(contexts).substitute(v) for k, v in (job.spec.get("env") or {}).items()}
        )
        result.steps = run.steps(job.spec["steps"], Scope(contexts), workspace)
        result.summary = run.summary
        result.seconds = time.monotonic() - started
        return result


def _base_environment() -> dict[str, str]:
    """The machine's environment without this session's Python, venv and runner variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(SESSION_VARIABLES)}
    keep = [
        p
        for p in env.get("PATH", "").split(os.pathsep)
        if p
        and ".pyenv" not in p
        and not (Path(p) / "pyvenv.cfg").exists()
        and not (Path(p).parent / "pyvenv.cfg").exists()
    ]
    env["PATH"] = os.pathsep.join(keep)
    return env


@dataclass
class _JobRun:
    runner: Runner
    workspace: Path
    env: dict[str, str]
    deadline: float
    defaults: dict[str, Any]
    summary: str = ""
    _files: itertools.count[int] = field(default_factory=itertools.count)

    def steps(
        self, specs: list[dict[str, Any]], scope: Scope, action_path: Path
    ) -> list[StepResult]:
        results = []
        for index, spec in enumerate(specs):
            extra = set(spec) - STEP_KEYS
            if extra:
                raise UnsupportedWorkflow(f"step {index} has keys this runner ignores: {extra}")
            name = scope.substitute(step_name(spec))
            started = time.monotonic()
            if not scope.condition(spec.get("if")):
                step = StepResult(name, "skipped", "skipped", note=f"if: {spec.get('if')}")
            elif spec.get("run") in self.runner.covered:
                note = f"covered: {self.runner.covered[spec['run']]} runs the same step"
                step = StepResult(name, "skipped", "skipped", note=note)
            elif "uses" in spec:
                step = self.uses(name, spec, scope)
            else:
                step = self.script(name, spec, scope, action_path)
            step.seconds = time.monotonic() - started
            if step.outcome == "failure" and _truthy_flag(scope, spec.get("continue-on-error")):
                step.conclusion = "success"
            if step.conclusion == "failure":
                scope.failed = True
            if "id" in spec:
                scope.steps[spec["id"]] = step
            results.append(step)
        return results

    def script(
        self, name: str, spec: dict[str, Any], scope: Scope, action_path: Path
    ) -> StepResult:
        if spec.get("shell", (self.defaults.get("run") or {}).get("shell")) != "bash":
            raise UnsupportedWorkflow(f"{name}: only shell: bash is modelled")
        n = next(self._files)
        files = self.workspace.parent / "files"
        files.mkdir(exist_ok=True)
        command_files = {
            key: files / f"{n}-{key.lower()}"
            for key in ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_PATH", "GITHUB_STEP_SUMMARY")
        }
        for path in command_files.values():
            path.write_text("")
        env = {**self.env, **{k: str(v) for k, v in command_files.items()}}
        env["GITHUB_ACTION_PATH"] = str(action_path)
        env.update({k: scope.substitute(v) for k, v in (spec.get("env") or {}).items()})
        directory = spec.get("working-directory") or (self.defaults.get("run") or {}).get(
            "working-directory"
        )
        cwd = self.workspace / scope.substitute(directory) if directory else self.workspace
        script = files / f"{n}.sh"
        # The script is the step's text; expressions in it are substituted first, as GitHub does.
        script.write_text(scope.substitute(spec["run"]) + "\n", encoding="utf-8", newline="\n")
        log = files / f"{n}.log"
        remaining = self.deadline - time.monotonic()
        if "timeout-minutes" in spec:
            remaining = min(remaining, 60 * float(spec["timeout-minutes"]))
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["bash", "--noprofile", "--norc", "-eo", "pipefail", str(script)],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                code = proc.wait(timeout=max(remaining, 1))
                note = "" if code == 0 else f"exit {code}"
            except subprocess.TimeoutExpired:
                if sys.platform != "win32":  # the runner runs ubuntu jobs only
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.kill()
                proc.wait()
                code, note = -9, "timed out: the job's timeout-minutes ran out"
        outcome: Outcome = "success" if code == 0 else "failure"
        for key, value in parse_command_file(command_files["GITHUB_ENV"].read_text()).items():
            self.env[key] = value
        for line in command_files["GITHUB_PATH"].read_text().splitlines():
            if line:
                self.env["PATH"] = line + os.pathsep + self.env["PATH"]
        self.summary += command_files["GITHUB_STEP_SUMMARY"].read_text(encoding="utf-8")
        return StepResult(
            name,
            outcome,
            outcome,
            outputs=parse_command_file(command_files["GITHUB_OUTPUT"].read_text(encoding="utf-8")),
            log=log.read_text(encoding="utf-8", errors="replace"),
            note=note,
        )

    def uses(self, name: str, spec: dict[str, Any], scope: Scope) -> StepResult:
        with_ = {k: scope.substitute(v) for k, v in (spec.get("with") or {}).items()}
        action = spec["uses"].split("@")[0]
        if action == "./":
            return self.composite(name, self.workspace, with_, scope)
        stand_in = {
            "actions/checkout": self.checkout,
            "actions/setup-python": self.setup_python,
            "actions/upload-artifact": self.upload_artifact,
        }.get(action)
        if stand_in is None:
            raise UnsupportedWorkflow(f"{name}: no stand-in for {spec['uses']}")
        return stand_in(name, with_)

    def composite(self, name: str, path: Path, with_: dict[str, str], caller: Scope) -> StepResult:
        action = load_yaml(path / "action.yml")
        declared = action.get("inputs") or {}
        unknown = set(with_) - set(declared)
        if unknown:
            raise UnsupportedWorkflow(f"{name}: the action declares no input {sorted(unknown)}")
        outer = {k: v for k, v in caller.contexts.items() if k in ("github", "runner")}
        inputs = {
            key: with_[key] if key in with_ else Scope(outer).substitute(spec.get("default", ""))
            for key, spec in declared.items()
        }
        scope = Scope({**outer, "inputs": inputs})
        inner = self.steps(action["runs"]["steps"], scope, path)
        outputs = {
            key: scope.substitute(spec["value"])
            for key, spec in (action.get("outputs") or {}).items()
        }
        failed = any(s.conclusion == "failure" for s in inner)
        outcome: Outcome = "failure" if failed else "success"
        return StepResult(name, outcome, outcome, outputs=outputs, inner=inner)

    def checkout(self, name: str, with_: dict[str, str]) -> StepResult:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=self.runner.repository,
            capture_output=True,
            timeout=60,
            check=True,
        ).stdout.decode()
        copied = 0
        for rel in filter(None, listed.split("\0")):
            source = self.runner.repository / rel
            if source.is_file():  # a tracked file deleted in the work tree is not there
                target = self.workspace / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
                copied += 1
        return StepResult(name, "success", "success", note=f"{copied} files of the work tree")

    def setup_python(self, name: str, with_: dict[str, str]) -> StepResult:
        version = with_.get("python-version", "")
        tools = Path(self.env["RUNNER_TOOL_CACHE"]) / "Python" / version
        try:
            interpreter = fresh_python(version, tools)
        except FileNotFoundError as exc:
            return StepResult(name, "failure", "failure", note=str(exc))
        if with_.get("update-environment", "true") != "false":
            self.env["PATH"] = os.pathsep.join([str(interpreter.parent), self.env["PATH"]])
            self.env["pythonLocation"] = str(tools)
        outputs = {"python-path": str(interpreter), "python-version": version}
        return StepResult(name, "success", "success", outputs=outputs, note=f"CPython {version}")

    def upload_artifact(self, name: str, with_: dict[str, str]) -> StepResult:
        source = self.workspace / with_.get("path", "")
        note = self.runner.uploads.add(with_.get("name", ""), source)
        outcome: Outcome = "failure" if note.startswith("failure") else "success"
        return StepResult(name, outcome, outcome, note=note)


def step_name(spec: dict[str, Any]) -> str:
    """A step's name as GitHub shows it: its name, else what it uses, else its first line."""
    return str(spec.get("name") or spec.get("uses") or spec["run"].splitlines()[0])


def _truthy_flag(scope: Scope, value: Any) -> bool:
    return value is not None and scope.substitute(value) == "true"


def coverage(job: Job, ran: list[JobResult], jobs: list[Job]) -> str:
    """For a job not run here: which of its steps a Linux job ran as is, and which need its OS.

    A step is covered when a Linux job of the same workflow job ran the same step (same
    ``run:``/``uses:``, ``with:`` and ``env:`` once the matrix is substituted, ``runner.os``
    aside) and the step's ``if:`` does not depend on the OS.
    """
    scope = Scope({"matrix": job.matrix, "runner": {"os": job.os_name}})
    # A Linux job that ran with other matrix values than written covers nothing that uses them.
    linux = [
        dataclasses.replace(j, matrix={**j.matrix, **r.overrides})
        for j, r in zip(jobs, ran, strict=True)
        if j.key == job.key and j.on_linux and r.passed
    ]
    covered: list[str] = []
    needs: list[str] = []
    for spec in job.spec["steps"]:
        name = scope.substitute(step_name(spec))
        condition = str(spec.get("if", ""))
        if "runner.os" in condition:
            if "Linux" in condition or job.os_name not in condition:
                continue  # does not run on this OS
            needs.append(name)
            continue
        same = [j for j in linux if _step_text(spec, j.matrix) == _step_text(spec, job.matrix)]
        (covered if same else needs).append(name)
    return (
        f"needs {job.runs_on}; {len(covered)} of its steps ran as written in the Linux job; "
        f"not run here: {', '.join(needs) if needs else 'none'}"
    )


def _step_text(spec: dict[str, Any], matrix: Mapping[str, str]) -> str:
    text = repr(sorted((k, spec[k]) for k in ("run", "uses", "with", "env") if k in spec))
    for key, value in matrix.items():
        text = re.sub(r"\$\{\{\s*matrix\." + re.escape(key) + r"\s*\}\}", value, text)
    return text
