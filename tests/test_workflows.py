"""Static checks of the composite action (action.yml) and the CI workflow (.github/workflows/ci.yml).

Torch-free and offline: the GitHub schemas bundled with check-jsonschema, zizmor's offline audits,
and the shape both files must keep (matrix, permissions, pins, the action's contract). How the
action's shell steps behave is tested by running them, in test_action_steps.py.

Nothing is read at import time: the live job copies tests/ out of the source tree, where these
files do not exist, and collection must still succeed there.
"""

from __future__ import annotations

import itertools
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path
from typing import Any, cast

import pytest

from dcp_invariant import runtimes

REPO = Path(__file__).resolve().parents[1]
ACTION = REPO / "action.yml"
CI = REPO / ".github" / "workflows" / "ci.yml"
RELEASE = REPO / ".github" / "workflows" / "release.yml"
NEWEST_TORCH = REPO / ".github" / "workflows" / "newest-torch.yml"
README = REPO / "README.md"
# The action's page of the docs: its inputs table and its workflow examples.
ACTION_PAGE = REPO / "docs" / "action.md"
EXAMPLE_FIXTURE = REPO / "examples" / "mlp_fixture.py"
BUGGY_FIXTURE = REPO / "examples" / "buggy_mlp_fixture.py"
ZIZMOR_CONFIG = REPO / ".github" / "zizmor.yml"
TOOL_TIMEOUT = 180

# The commit each release tag points at, in the actions' own repositories (github.com/actions/
# upload-artifact, setup-python and checkout, tags v7.0.1, v7.0.0 and v7.0.1; download-artifact
# v8.0.1 and attest-build-provenance v4.1.0; github.com/pypa/gh-action-pypi-publish v1.8.14).
PINNED = {
    ("actions/upload-artifact", "v7.0.1"): "043fb46d1a93c77aae656e7c1c64a875d1fc6a0a",
    ("actions/setup-python", "v7.0.0"): "5fda3b95a4ea91299a34e894583c3862153e4b97",
    ("actions/checkout", "v7.0.1"): "3d3c42e5aac5ba805825da76410c181273ba90b1",
    ("actions/download-artifact", "v8.0.1"): "3e5f45b2cfb9172054b4087a40e8e0b5a5461e7c",
    ("actions/attest-build-provenance", "v4.1.0"): "a2bbfa25375fe432b6a289bc6b6cd05ecd0c4c32",
    ("pypa/gh-action-pypi-publish", "v1.8.14"): "81e9d935c883d0b210363ab89cf05f3894778450",
}
# Thirteen jobs: quality on two OSes and every supported Python, integration on every OS the
# docs name and two torch releases, one package-boundary job.
# (OSes, second axis, its values). The integration jobs run the oldest and newest registered
# torch release on each OS.
MATRICES = {
    "quality": (["ubuntu-latest", "windows-latest"], "python", ["3.11", "3.12", "3.13"]),
    "integration": (
        ["ubuntu-latest", "windows-latest", "macos-latest"],
        "torch",
        [runtimes.releases()[0], runtimes.releases()[-1]],
    ),
}
SUPPORTED_PYTHONS = {"3.11", "3.12", "3.13"}
ACTION_INPUTS = {
    "torch-version",
    "python-version",
    "environment",
    "output-dir",
    "artifact-name",
    "source-revision",
    "upload",
    "retention-days",
    "run-suite",
    "fixture",
    "world-sizes",
    "steps-before",
    "steps-after",
    "attest",
}
# Passed to `dcp_invariant run` only when non-empty, as flags of the same name.
FIXTURE_INPUTS = ("fixture", "world-sizes", "steps-before", "steps-after")
ACTION_OUTPUTS = {
    "verdict",
    "passed",
    "failed",
    "manifest-sha256",
    "evidence-dir",
    "attestation-id",
    "attestation-url",
}


def load_yaml(path: Path) -> Any:
    # Imported here, not at module level: ruamel.yaml comes with check-jsonschema (the `test`
    # extra), which the live job does not install, and that job still collects this module.
    from ruamel.yaml import YAML

    return YAML(typ="safe").load(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def action() -> dict[str, Any]:
    return cast(dict[str, Any], load_yaml(ACTION))


@pytest.fixture(scope="module")
def ci() -> dict[str, Any]:
    return cast(dict[str, Any], load_yaml(CI))


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def action_steps(action: dict[str, Any]) -> list[dict[str, Any]]:
    return cast(list[dict[str, Any]], action["runs"]["steps"])


def ci_steps(ci: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in ci["jobs"].values() for step in job.get("steps", [])]


def tool(name: str) -> str | None:
    """A console script installed next to this interpreter, else one on PATH."""
    scripts = Path(sysconfig.get_path("scripts"))
    for candidate in (scripts / name, scripts / f"{name}.exe"):
        if candidate.is_file():
            return str(candidate)
    return shutil.which(name)


# --- external validators ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ("vendor.github-actions", ACTION),
        ("vendor.github-workflows", CI),
        ("vendor.github-workflows", RELEASE),
        ("vendor.github-workflows", NEWEST_TORCH),
    ],
    ids=["action.yml", "ci.yml", "release.yml", "newest-torch.yml"],
)
def test_files_match_githubs_schema(schema: str, path: Path) -> None:
    pytest.importorskip(
        "check_jsonschema",
        reason="check-jsonschema is not installed (it comes with the `test` extra)",
    )
    # The vendor schemas ship inside check-jsonschema, so this needs no network.
    done = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", schema, str(path)],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        cwd=REPO,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr


def test_zizmor_reports_no_findings() -> None:
    zizmor = tool("zizmor")
    if zizmor is None:
        pytest.skip("zizmor is not installed (it comes with the `test` extra)")
    # --strict-collection: a file zizmor cannot parse is an error, not silently unaudited.
    # .github/zizmor.yml is picked up from the repository root.
    done = subprocess.run(
        [zizmor, "--offline", "--strict-collection", "."],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT,
        cwd=REPO,
        check=False,
    )

    assert done.returncode == 0, done.stdout + done.stderr


def disabled_rules_and_comments(text: str) -> dict[str, bool]:
    """For each rule block under ``rules:`` that sets ``disable: true``: is a comment line
    above that ``disable`` within the block?"""
    found: dict[str, bool] = {}
    in_rules = False
    rule: str | None = None
    commented = False
    for line in text.splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if not stripped:
            continue
        if indent == 0 and not stripped.startswith("#"):
            in_rules = stripped == "rules:"
            rule = None
            continue
        if not in_rules:
            continue
        if indent <= 2 and not stripped.startswith("#"):
            rule, commented = stripped.rstrip(":"), False
        elif rule is not None and stripped.startswith("#"):
            commented = True
        elif rule is not None and re.fullmatch(r"disable:\s*true(\s+#.*)?", stripped):
            # A trailing comment on the disable line itself also counts as a reason.
            found[rule] = commented or "#" in stripped
    return found


def test_every_disabled_zizmor_rule_says_why() -> None:
    text = ZIZMOR_CONFIG.read_text(encoding="utf-8")
    parsed = load_yaml(ZIZMOR_CONFIG) or {}
    disabled = {
        name for name, rule in (parsed.get("rules") or {}).items() if (rule or {}).get("disable")
    }

    found = disabled_rules_and_comments(text)

    # The line scanner must see every rule the parser says is disabled, or it proves nothing.
    assert set(found) == disabled
    assert [rule for rule, commented in found.items() if not commented] == []


def test_the_comment_scanner_catches_an_unexplained_disable() -> None:
    # The scanner above is this file's own parser: show it can fail.
    text = "rules:\n  a:\n    # why\n    disable: true\n  b:\n    disable: true\n"
    assert disabled_rules_and_comments(text) == {"a": True, "b": False}


# --- ci.yml ----------------------------------------------------------------------------------


def matrix_size(job: dict[str, Any]) -> int:
    matrix = (job.get("strategy") or {}).get("matrix")
    if matrix is None:
        return 1
    # include/exclude would make the count below wrong; the workflow does not use them.
    assert set(matrix) <= {"os", "python", "torch"}, matrix
    return len(list(itertools.product(*matrix.values())))


def test_ci_runs_exactly_three_jobs_expanding_to_thirteen(ci: dict[str, Any]) -> None:
    jobs = ci["jobs"]

    assert set(jobs) == {"quality", "integration", "package-boundary"}
    sizes = {name: matrix_size(job) for name, job in jobs.items()}
    assert sizes == {"quality": 6, "integration": 6, "package-boundary": 1}
    assert sum(sizes.values()) == 13


@pytest.mark.parametrize("job", sorted(MATRICES))
def test_matrix_axes(ci: dict[str, Any], job: str) -> None:
    matrix = ci["jobs"][job]["strategy"]["matrix"]
    oses, axis, values = MATRICES[job]

    assert set(matrix) == {"os", axis}
    assert matrix["os"] == oses
    # Strings, not floats: unquoted 3.10 would become 3.1, and setup-python would get that.
    assert matrix[axis] == values
    assert all(isinstance(v, str) for v in matrix[axis])


def test_every_documented_os_runs_the_action_and_every_python_is_tested(
    ci: dict[str, Any],
) -> None:
    from ruamel.yaml import YAML

    documented_oses = set()
    for block in doc_blocks("yaml", README, ACTION_PAGE):
        parsed = YAML(typ="safe").load(block)
        for job in parsed.get("jobs", {}).values() if isinstance(parsed, dict) else []:
            documented_oses |= set(((job.get("strategy") or {}).get("matrix") or {}).get("os", []))
    assert {"ubuntu-latest", "windows-latest", "macos-latest"} <= documented_oses

    # The integration job is the one that runs the action (uses: ./) on each OS.
    assert documented_oses <= set(ci["jobs"]["integration"]["strategy"]["matrix"]["os"])
    tested = {
        python
        for job in ci["jobs"].values()
        for python in ((job.get("strategy") or {}).get("matrix") or {}).get("python", [])
    }
    assert tested == SUPPORTED_PYTHONS


def test_every_job_has_a_timeout(ci: dict[str, Any]) -> None:
    timeouts = {name: job.get("timeout-minutes") for name, job in ci["jobs"].items()}

    assert all(isinstance(t, int) and t > 0 for t in timeouts.values()), timeouts


def test_workflow_token_is_read_only_and_runs_cancel_superseded(ci: dict[str, Any]) -> None:
    assert ci["permissions"] == {"contents": "read"}
    assert ci["concurrency"]["cancel-in-progress"] is True
    # No job widens the token again.
    assert [name for name, job in ci["jobs"].items() if "permissions" in job] == []


def test_checkout_does_not_persist_credentials(ci: dict[str, Any]) -> None:
    checkouts = [s for s in ci_steps(ci) if str(s.get("uses", "")).startswith("actions/checkout@")]

    assert len(checkouts) == len(ci["jobs"])
    assert all((s.get("with") or {}).get("persist-credentials") is False for s in checkouts)


REMOTE_USES = re.compile(
    r"^\s*(?:-\s+)?uses:\s*(?P<action>[\w.-]+/[\w./-]+)@(?P<ref>\S+)(?P<rest>.*)$"
)
PINNED_USES = re.compile(r"^[0-9a-f]{40}$")
VERSION_COMMENT = re.compile(r"^\s+#\s*(?P<version>v\d+\.\d+\.\d+)\s*$")


@pytest.mark.parametrize(
    "path",
    [CI, RELEASE, NEWEST_TORCH, ACTION],
    ids=["ci.yml", "release.yml", "newest-torch.yml", "action.yml"],
)
def test_remote_actions_are_pinned_to_the_known_release_commits(path: Path) -> None:
    parsed = load_yaml(path)
    steps = action_steps(parsed) if path == ACTION else ci_steps(parsed)
    remote = sorted(
        s["uses"] for s in steps if "uses" in s and not s["uses"].startswith(("./", "docker://"))
    )
    assert remote, "expected remote actions to check"

    seen = []
    for line in path.read_text(encoding="utf-8").splitlines():
        match = REMOTE_USES.match(line)
        if match is None:
            continue
        action, ref, rest = match["action"], match["ref"], match["rest"]
        seen.append(f"{action}@{ref}")
        assert PINNED_USES.match(ref), f"{line.strip()}: not pinned by a full commit SHA"
        comment = VERSION_COMMENT.match(rest)
        assert comment, f"{line.strip()}: no `# vX.Y.Z` comment naming the pinned release"
        expected = PINNED.get((action, comment["version"]))
        assert expected is not None, f"{line.strip()}: no recorded SHA for this release"
        assert ref == expected, f"{line.strip()}: {action} {comment['version']} is {expected}"

    # The line scan must have seen every `uses:` the YAML parser found (no flow-style escapees).
    assert sorted(seen) == remote


# --- release.yml ---------------------------------------------------------------------------


def test_release_runs_on_version_tags_with_the_least_permissions() -> None:
    release = load_yaml(RELEASE)
    jobs = release["jobs"]

    # YAML 1.1 reads the key `on` as true.
    assert release.get(True, release.get("on")) == {"push": {"tags": ["v*"]}}
    assert release["permissions"] == {}
    # The OIDC token only where PyPI and the attestation need it; write access to the repository
    # only where the GitHub release is made.
    assert {name: job["permissions"] for name, job in jobs.items()} == {
        "build": {"contents": "read"},
        "publish": {"id-token": "write", "attestations": "write"},
        "github-release": {"contents": "write"},
    }
    assert jobs["publish"]["needs"] == "build" and jobs["github-release"]["needs"] == "publish"
    assert jobs["publish"]["environment"]["name"] == "pypi"
    assert all("timeout-minutes" in job for job in jobs.values())


def test_release_checks_attests_publishes_and_attaches_the_same_files() -> None:
    jobs = load_yaml(RELEASE)["jobs"]
    build = "\n".join(s.get("run", "") for s in jobs["build"]["steps"])
    publish = [s.get("uses", "").split("@")[0] for s in jobs["publish"]["steps"]]
    uploads = {
        s["with"]["name"]: s["with"]["path"]
        for s in jobs["build"]["steps"]
        if s.get("uses", "").startswith("actions/upload-artifact@")
    }

    for command in (
        "python -m build --sdist --wheel",
        "twine check --strict",
        "check-wheel-contents",
    ):
        assert command in build
    assert "pytest -m package" in build
    assert publish == [
        "actions/download-artifact",
        "actions/attest-build-provenance",
        "pypa/gh-action-pypi-publish",
    ]
    # SHA256SUMS travels apart from dist/: the publisher uploads every file in dist/.
    assert uploads == {"dist": "dist/", "sums": "sums/SHA256SUMS"}
    attach = jobs["github-release"]["steps"][-1]["run"]
    assert "sha256sum --check" in attach and "dist/* sums/SHA256SUMS" in attach


def test_integration_self_tests_the_action_and_its_failure_path(ci: dict[str, Any]) -> None:
    steps = ci["jobs"]["integration"]["steps"]
    local = [i for i, s in enumerate(steps) if s.get("uses") == "./"]
    assert len(local) == 2, "expected a passing run of ./ and a run against tampered evidence"
    suite, tampered = (steps[i] for i in local)

    # The first run does the real work and exposes the evidence the second one tampers with.
    assert (suite.get("with") or {}).get("run-suite", "true") == "true"
    assert "continue-on-error" not in suite
    tamper_steps = [
        s
        for s in steps[local[0] + 1 : local[1]]
        if f"steps.{suite['id']}.outputs.evidence-dir" in str(s.get("env", ""))
    ]
    assert len(tamper_steps) == 1
    assert tampered["with"]["output-dir"] in tamper_steps[0]["run"]

    # The second run only verifies, may fail, and must not upload a second artifact.
    assert tampered["continue-on-error"] is True
    assert tampered["with"]["run-suite"] == "false"
    assert tampered["with"]["upload"] == "false"

    # ... and the step right after it fails the job unless the gate rejected the evidence: the
    # run failed AND the verifier said fail (an install error also fails the run).
    check = steps[local[1] + 1]
    condition = re.sub(r"^\$\{\{\s*|\s*\}\}$", "", check["if"].strip())
    assert condition == (
        f"steps.{tampered['id']}.outcome != 'failure' "
        f"|| steps.{tampered['id']}.outputs.verdict != 'fail'"
    )
    assert re.search(r"^\s*exit 1\s*$", check["run"], re.MULTILINE)


def test_live_tests_use_the_actions_environment(ci: dict[str, Any]) -> None:
    steps = ci["jobs"]["integration"]["steps"]
    suite = next(s for s in steps if s.get("uses") == "./")
    live = [s for s in steps if 'pytest -m "live or torch"' in s.get("run", "")]
    assert len(live) == 1

    # The action leaves the job's Python alone, so the live tests run its environment's.
    assert live[0]["env"]["PYTHON"].replace(" ", "") == (
        f"${{{{steps.{suite['id']}.outputs.python-path}}}}"
    )
    assert re.findall(r"(\S+) -m (?:pip|pytest)", live[0]["run"]) == ['"$PYTHON"', '"$PYTHON"']


# --- action.yml ------------------------------------------------------------------------------


def test_action_metadata(action: dict[str, Any]) -> None:
    assert action["runs"]["using"] == "composite"
    for key in ("name", "description", "author"):
        assert isinstance(action.get(key), str) and action[key].strip(), key
    assert action["branding"].get("icon") and action["branding"].get("color")


def test_action_inputs_have_string_defaults(action: dict[str, Any]) -> None:
    inputs = action["inputs"]

    assert ACTION_INPUTS - set(inputs) == set()
    # GitHub passes inputs as strings; a YAML true or 30 would read differently per context.
    defaults = {name: spec.get("default") for name, spec in inputs.items()}
    assert {n: d for n, d in defaults.items() if not isinstance(d, str)} == {}
    assert inputs["torch-version"]["default"] == runtimes.DEFAULT_TORCH_VERSION
    assert inputs["python-version"]["default"] == "3.11"
    assert inputs["upload"]["default"] in {"true", "false"}
    # Empty: the registered suite, and the tool's own defaults for its options.
    assert {name: inputs[name]["default"] for name in FIXTURE_INPUTS} == dict.fromkeys(
        FIXTURE_INPUTS, ""
    )


def test_suite_step_passes_the_fixture_inputs_and_runs_in_the_workspace(
    action: dict[str, Any],
) -> None:
    suites = [s for s in action_steps(action) if "dcp_invariant run" in s.get("run", "")]
    assert len(suites) == 1
    suite = suites[0]

    # Every input reaches the input check, through env:, one variable per input, before
    # anything is installed; it writes run's arguments, which the suite step passes one a line
    # (test_action_steps.py runs both).
    [checks] = [s for s in action_steps(action) if "action-inputs" in s.get("run", "")]
    env = {str(v).replace(" ", "") for v in checks["env"].values()}
    assert {f"${{{{inputs.{name}}}}}" for name in action["inputs"]} - env == {
        "${{inputs.python-version}}"  # setup-python's, before the check
    }
    assert "${{steps.venv.outputs.arguments-file}}" in {
        str(v).replace(" ", "") for v in suite["env"].values()
    }
    for name in FIXTURE_INPUTS:
        assert f"DCPI_{name.upper().replace('-', '_')}" in checks["env"], name
    # No working-directory: a composite action's run step starts in $GITHUB_WORKSPACE (the
    # runner's ScriptHandler joins the workspace with an empty working-directory, and job
    # `defaults.run` do not reach composite steps), where the caller's checkout is, so a
    # fixture module in it is importable.
    assert "working-directory" not in suite


def requirement_pin(requirements: list[str], name: str) -> str:
    pins = [r for r in requirements if re.match(rf"{name}\s*==", r)]
    assert len(pins) == 1, requirements
    return pins[0].replace(" ", "")


def test_action_installs_the_runtime_pins(
    action: dict[str, Any], pyproject: dict[str, Any]
) -> None:
    runtime = pyproject["project"]["optional-dependencies"]["runtime"]
    scripts = "\n".join(s.get("run", "") for s in action_steps(action))

    assert set(re.findall(r"numpy==[\w.]+", scripts)) == {requirement_pin(runtime, "numpy")}
    # The action's torch default and the runtime extra must name the same release.
    assert requirement_pin(runtime, "torch") == f"torch=={runtimes.DEFAULT_TORCH_VERSION}"


def test_the_live_job_installs_the_loops_and_frameworks_extras_pins(
    ci: dict[str, Any], pyproject: dict[str, Any]
) -> None:
    extras = pyproject["project"]["optional-dependencies"]
    steps = ci["jobs"]["integration"]["steps"]
    (live,) = [s for s in steps if '-m "live or torch"' in s.get("run", "")]
    installed = re.findall(r'"([\w-]+==[\w.]+)"', live["run"])
    # pytest and pytest-xdist (the plugin's parallel run) at the test extra's pins.
    runners = [p for p in extras["test"] if p.startswith(("pytest==", "pytest-xdist=="))]

    assert sorted(installed) == sorted([*extras["loops"], *extras["frameworks"], *runners])


def test_the_weekly_real_loops_take_cpu_torch_at_the_runtime_pin(pyproject: dict[str, Any]) -> None:
    extras = pyproject["project"]["optional-dependencies"]
    job = load_yaml(NEWEST_TORCH)["jobs"]["real-loops"]
    script = "\n".join(s.get("run", "") for s in job["steps"])
    # From the CPU index, before anything that could pull PyPI's multi-GB CUDA build for it.
    cpu = re.findall(
        r'--index-url https://download\.pytorch\.org/whl/cpu "(torch==[\w.]+)"', script
    )
    assert cpu == [requirement_pin(extras["runtime"], "torch")]
    assert script.index("whl/cpu") < script.index("[runtime,loops]")
    assert "-m real_loops" in script


def test_action_outputs_come_from_existing_steps(action: dict[str, Any]) -> None:
    ids = {s["id"] for s in action_steps(action) if "id" in s}
    outputs = action["outputs"]

    assert ACTION_OUTPUTS - set(outputs) == set()
    for name in ACTION_OUTPUTS:
        match = re.fullmatch(
            r"\$\{\{ steps\.(?P<id>[\w-]+)\.outputs\.(?P<key>[\w-]+) \}\}", outputs[name]["value"]
        )
        assert match, f"output {name}: {outputs[name]['value']!r}"
        assert match["id"] in ids, f"output {name} names step {match['id']!r}, which has no such id"


def test_run_steps_are_bash_without_expressions(action: dict[str, Any]) -> None:
    runs = [s for s in action_steps(action) if "run" in s]
    assert runs

    for step in runs:
        name = step.get("name", step["run"])
        assert step.get("shell") == "bash", name
        # An expression in a script is pasted in before the shell parses it: inputs could
        # inject commands. Values reach scripts through env: instead.
        assert "${{" not in step["run"], name
        # On Windows, ${{ github.action_path }} is a backslashed path pasted into a bash script,
        # where bash reads the backslashes as escapes; the scripts use "$GITHUB_ACTION_PATH".
        assert "github.action_path" not in step["run"], name


def test_upload_step(action: dict[str, Any]) -> None:
    uploads = [
        s
        for s in action_steps(action)
        if str(s.get("uses", "")).startswith("actions/upload-artifact@")
    ]
    assert len(uploads) == 1
    upload = uploads[0]

    assert upload["with"]["if-no-files-found"] == "error"
    # Evidence of a failed suite is exactly what must be uploaded: the step needs a status
    # function, or GitHub's implicit success() skips it after the suite fails.
    assert "!cancelled()" in upload["if"] or "always()" in upload["if"]
    # ... but only when the report step found evidence: a suite that wrote nothing must not
    # add a second "No files were found" failure (test_action_steps.py runs both cases).
    assert "steps.report.outputs.has-evidence == 'true'" in " ".join(upload["if"].split())


def test_action_installs_into_its_own_environment(action: dict[str, Any]) -> None:
    steps = action_steps(action)
    setup = [s for s in steps if str(s.get("uses", "")).startswith("actions/setup-python@")]
    assert len(setup) == 1
    # The Python it sets up is not put on the caller's PATH.
    assert str(setup[0]["with"]["update-environment"]).lower() == "false"

    venv = [s for s in steps if s.get("id") == "venv"]
    assert len(venv) == 1
    assert "$RUNNER_TEMP/dcp-invariant-venv-" in venv[0]["run"]
    assert '"$base" -m venv' in venv[0]["run"]
    # uv from PyPI at an exact version.
    assert re.fullmatch(r"\d+\.\d+\.\d+", venv[0]["env"]["UV_VERSION"])
    assert '"uv==$UV_VERSION"' in venv[0]["run"]

    # Every later script runs the environment's interpreter (or, installing, its uv), never a
    # bare python.
    later = [s for s in steps[steps.index(venv[0]) + 1 :] if "run" in s]
    assert len(later) == 4
    for step in later:
        assert step["env"]["PYTHON"].replace(" ", "") == "${{steps.venv.outputs.python-path}}"
        interpreters = set(re.findall(r"(\S+) -m \w", step["run"]))
        expected = '"$UV_PYTHON"' if step.get("id") == "install" else '"$PYTHON"'
        assert interpreters == {expected}, step["name"]
    install = next(s for s in later if s.get("id") == "install")
    assert install["env"]["UV_PYTHON"].replace(" ", "") == "${{steps.venv.outputs.uv-python}}"


def test_action_installs_the_cpu_build_with_uv(action: dict[str, Any]) -> None:
    install = [s for s in action_steps(action) if s.get("id") == "install"]
    assert len(install) == 1
    script = install[0]["run"]

    assert '"$UV_PYTHON" -m uv pip install' in script
    assert '--python "$PYTHON"' in script
    # uv sends torch alone to PyTorch's CPU index off macOS (test_action_steps.py runs each OS).
    assert "--torch-backend cpu" in script
    assert '"$RUNNER_OS" != macOS' in script


def test_last_step_is_the_offline_gate(action: dict[str, Any]) -> None:
    last = action_steps(action)[-1]

    assert "dcp_invariant verify" in last.get("run", "")


# --- README.md and docs/action.md ----------------------------------------------------------


def doc_blocks(language: str, *pages: Path) -> list[str]:
    """The fenced blocks of ``language`` ("" for none) in ``pages`` (the README by default)."""
    blocks: list[str] = []
    for page in pages or (README,):
        text = page.read_text(encoding="utf-8")
        blocks += re.findall(rf"^```{language}\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)
    return blocks


def test_ci_runs_exactly_the_readme_test_command_with_the_actions_uv() -> None:
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    [quick_start] = [b for b in doc_blocks("") if b.startswith("git clone ")]
    commands = [line.split("  #")[0].strip() for line in quick_start.splitlines()]
    test_command = commands[-1]
    ci_lines = [line for line in ci.splitlines() if line and not line.startswith("#")]

    # The README's last First run line, as .ci/run's last; the uv it installs is the action's.
    assert ci_lines[-1] == test_command == "uv run --extra dev pytest"
    assert [c for c in commands if c.startswith("uv run ")] == commands[1:]
    assert re.findall(r'"uv==([\d.]+)"', ci) == re.findall(
        r'UV_VERSION: "([\d.]+)"', ACTION.read_text(encoding="utf-8")
    )


def test_the_docs_input_table_lists_every_action_input(action: dict[str, Any]) -> None:
    lines = ACTION_PAGE.read_text(encoding="utf-8").splitlines()
    start = lines.index("| input | default | meaning |")
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        match = re.match(r"\| `([\w-]+)` \|", line)
        assert match, line
        rows.append(match[1])

    assert rows == list(action["inputs"])


def test_readme_example_fixtures_are_the_example_files() -> None:
    if not EXAMPLE_FIXTURE.is_file():
        pytest.skip("examples/ is not here (outside the source tree)")
    blocks = doc_blocks("python")

    # Pasted verbatim, so what the README shows is what runs: the example, then its buggy copy.
    assert blocks == [f.read_text(encoding="utf-8") for f in (EXAMPLE_FIXTURE, BUGGY_FIXTURE)]


def test_documented_workflows_use_only_declared_inputs_and_pinned_refs(
    action: dict[str, Any],
) -> None:
    from ruamel.yaml import YAML

    steps = []
    for block in doc_blocks("yaml", README, ACTION_PAGE):
        parsed = YAML(typ="safe").load(block)
        if isinstance(parsed, list):  # a bare list of steps
            steps += parsed
        else:
            steps += [s for job in parsed["jobs"].values() for s in job["steps"]]
    ours = [s for s in steps if str(s.get("uses", "")).startswith("tiramitree/dcp-invariant@")]
    checkouts = [s["uses"] for s in steps if str(s.get("uses", "")).startswith("actions/checkout@")]

    assert ours
    for step in ours:
        assert set(step.get("with") or {}) <= set(action["inputs"]), step
    assert checkouts == [f"actions/checkout@{PINNED[('actions/checkout', 'v7.0.1')]}"]
    assert any((s.get("with") or {}).get("fixture") for s in ours)
    # No tag of this tree exists yet, so a `@v0.5.0` would not resolve: each snippet pins a
    # commit, written as the placeholder the docs tell users to fill in (or a full SHA), never a
    # movable ref.
    refs = {str(s["uses"]).split("@", 1)[1] for s in ours}
    assert all(r == "COMMIT_SHA" or re.fullmatch(r"[0-9a-f]{40}", r) for r in refs), refs
