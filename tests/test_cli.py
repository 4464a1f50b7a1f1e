"""The command line without torch: list, verify, and every way `run` refuses before it starts.

No test here may run the suite: an autouse fixture replaces ``runner.run_suite`` so that a
validation regression fails fast instead of launching eleven scenarios.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from artifact_data import Observations, Rebuild

from dcp_invariant import cli, errors, fixture_inputs, plan, runtimes
from dcp_invariant.evidence import schema
from dcp_invariant.evidence.verify import verify_artifact

SUBPROCESS_TIMEOUT = 60
REVISION = "a" * 40


@pytest.fixture(autouse=True)
def suite_must_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    from dcp_invariant.suite import runner

    def refuse(**kwargs: object) -> None:
        raise AssertionError("a CLI test reached runner.run_suite")

    monkeypatch.setattr(runner, "run_suite", refuse)


def snapshot(directory: Path) -> dict[str, bytes | None]:
    """Every entry below ``directory`` with its bytes (None for directories)."""
    return {
        str(p.relative_to(directory)): None if p.is_dir() else p.read_bytes()
        for p in sorted(directory.rglob("*"))
    }


def usage_error(capsys: pytest.CaptureFixture[str]) -> str:
    """The single stderr line of a usage error; nothing may reach stdout."""
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("dcp-invariant: error: ")
    return lines[0]


# --- list ------------------------------------------------------------------------------------


def test_list_prints_the_scenarios_in_schema_order(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list"]) == errors.EXIT_OK

    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(plan.SCENARIOS) == 11
    assert [line.split()[0] for line in lines] == list(plan.SCENARIO_NAMES)
    for line, scenario in zip(lines, plan.SCENARIOS, strict=True):
        assert line.endswith(scenario.summary)


# --- verify ----------------------------------------------------------------------------------


def test_verify_passes_the_real_artifact(
    data_artifact: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["verify", str(data_artifact)]) == errors.EXIT_OK

    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(plan.SCENARIO_NAMES) + 1
    assert [line.split() for line in lines[:-1]] == [["PASS", n] for n in plan.SCENARIO_NAMES]
    assert lines[-1] == f"pass: {len(plan.SCENARIO_NAMES)} passed, 0 failed"


def test_verify_accepts_the_same_directory_twice(
    data_artifact: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["verify", str(data_artifact), "--artifact-dir", str(data_artifact)]
    assert cli.main(argv) == errors.EXIT_OK
    assert capsys.readouterr().out.splitlines()[-1].startswith("pass: ")


def test_verify_lists_every_problem_of_a_tampered_artifact(
    artifact_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (artifact_copy / schema.observation_file("dtensor_1_to_2")).unlink()
    (artifact_copy / "stray.txt").write_bytes(b"\n")
    (artifact_copy / schema.SUMMARY_FILE).write_bytes(b"{}\n")
    expected = verify_artifact(artifact_copy).problems
    assert len(expected) >= 3

    assert cli.main(["verify", str(artifact_copy)]) == errors.EXIT_FAIL

    lines = capsys.readouterr().out.splitlines()
    assert [line[len("invalid: ") :] for line in lines if line.startswith("invalid: ")] == expected
    # The scenario whose observation is gone has no verdict to print.
    assert "INVALID  dtensor_1_to_2" in lines
    assert lines[-1] == f"verdict: invalid artifact ({len(expected)} problems)"


def test_verify_fails_a_valid_artifact_with_a_failed_scenario(
    rebuild: Rebuild, capsys: pytest.CaptureFixture[str]
) -> None:
    def promote(observations: Observations) -> None:
        observations["corrupt_shard"]["candidate"]["promoted"] = True

    directory = rebuild(promote)
    report = verify_artifact(directory)
    assert report.valid

    assert cli.main(["verify", str(directory)]) == errors.EXIT_FAIL

    lines = capsys.readouterr().out.splitlines()
    assert "FAIL     corrupt_shard" in lines
    for reason in report.results["corrupt_shard"]["reasons"]:
        assert f"         - {reason}" in lines
    failed = sum(r["verdict"] == "fail" for r in report.results.values())
    assert lines[-1] == f"fail: {len(report.results) - failed} passed, {failed} failed"


@pytest.mark.parametrize(
    ("argv", "text"),
    [
        (lambda tmp: ["verify"], "no artifact directory"),
        (lambda tmp: ["verify", str(tmp / "nope")], "nope is not a directory"),
        (lambda tmp: ["verify", "--artifact-dir", str(tmp / "nope")], "nope is not a directory"),
        (
            lambda tmp: ["verify", str(tmp / "a"), "--artifact-dir", str(tmp / "b")],
            "give the artifact directory once",
        ),
        (lambda tmp: ["verify", str(tmp / "a"), "--bogus"], "unrecognized arguments: --bogus"),
    ],
    ids=[
        "no directory",
        "nonexistent",
        "nonexistent --artifact-dir",
        "two directories",
        "bad option",
    ],
)
def test_verify_usage_errors(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: Callable[[Path], list[str]],
    text: str,
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()

    assert cli.main(argv(tmp_path)) == errors.EXIT_USAGE

    assert text in usage_error(capsys)


def test_verify_refuses_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "artifact.zip"
    path.write_bytes(b"PK")

    assert cli.main(["verify", str(path)]) == errors.EXIT_USAGE

    assert "artifact.zip is not a directory" in usage_error(capsys)


def test_verify_of_an_empty_directory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["verify", str(tmp_path)]) == errors.EXIT_FAIL

    assert capsys.readouterr().out == "not a dcp-invariant artifact: no manifest.sha256\n"


def test_verify_of_the_repository_root_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).parent.parent
    assert cli.main(["verify", str(root)]) == errors.EXIT_FAIL

    assert capsys.readouterr().out == "not a dcp-invariant artifact: no manifest.sha256\n"


def test_verify_verbose_lists_every_problem_of_a_non_artifact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_bytes(b"x")

    assert cli.main(["verify", "--verbose", str(tmp_path)]) == errors.EXIT_FAIL

    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "not a dcp-invariant artifact: no manifest.sha256"
    assert "invalid: notes.txt: unexpected file" in lines
    assert "invalid: manifest.sha256: missing" in lines
    assert lines[-1].startswith("verdict: invalid artifact (")


def test_verify_of_an_artifact_without_its_manifest_lists_everything(
    artifact_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # provenance.json is there: it is an artifact, damaged, and every problem matters.
    (artifact_copy / schema.MANIFEST_FILE).unlink()

    assert cli.main(["verify", str(artifact_copy)]) == errors.EXIT_FAIL

    lines = capsys.readouterr().out.splitlines()
    assert "invalid: manifest.sha256: missing" in lines
    assert lines[-1] == "verdict: invalid artifact (1 problems)"


def test_verify_refuses_an_artifact_root_that_is_a_symlink(
    artifact_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    link = tmp_path / "link"
    try:
        os.symlink(artifact_copy, link, target_is_directory=True)
    except (OSError, NotImplementedError) as exc:
        pytest.skip(f"symlinks unsupported here: {exc}")

    assert cli.main(["verify", str(link)]) == errors.EXIT_FAIL

    out = capsys.readouterr().out
    assert "invalid: link: is a symlink; pass the real artifact directory" in out
    # The directory it points to is a good artifact.
    assert cli.main(["verify", str(artifact_copy)]) == errors.EXIT_OK


def test_verify_prints_each_problem_on_one_line(
    artifact_copy: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (artifact_copy / "a\nb\rc\x1b[31m").write_bytes(b"")

    assert cli.main(["verify", str(artifact_copy)]) == errors.EXIT_FAIL

    lines = capsys.readouterr().out.splitlines()
    assert "invalid: a\\nb\\rc\\x1b[31m: unexpected file" in lines
    assert lines[-1] == "verdict: invalid artifact (1 problems)"


def test_verify_refuses_a_name_too_long_for_the_os(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["verify", "x" * 5000]) == errors.EXIT_USAGE

    assert "is not a directory" in usage_error(capsys)


@pytest.mark.parametrize("verbose", [[], ["--verbose"]], ids=["plain", "verbose"])
def test_verify_piped_into_head_exits_quietly(data_artifact: Path, verbose: list[str]) -> None:
    # `verify DIR | head -1`: the reader goes away after one line.
    script = (
        "import os, sys\n"
        "r, w = os.pipe(); os.close(r); os.dup2(w, 1)\n"
        "from dcp_invariant import cli\n"
        f"sys.exit(cli.main(['verify', {str(data_artifact)!r}, *{verbose!r}]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        check=False,
    )

    assert done.stderr == ""
    assert done.returncode == errors.EXIT_OK  # the verdict, not the broken pipe


@pytest.mark.parametrize("argv", [[], ["bogus"]], ids=["no command", "unknown command"])
def test_top_level_usage_error_names_a_real_command(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == errors.EXIT_USAGE
    line = usage_error(capsys)
    assert "dcp-invariant dcp-invariant" not in line


@pytest.mark.parametrize("argv", [[], ["bogus"]], ids=["no command", "unknown command"])
def test_top_level_usage_error_is_one_line(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == errors.EXIT_USAGE
    assert "--help" in usage_error(capsys)


# --- run: refusals before any scenario starts ------------------------------------------------


def test_run_refuses_an_existing_output_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "evidence"
    output.mkdir()
    (output / "keep.txt").write_bytes(b"mine\n")
    before = snapshot(tmp_path)

    code = cli.main(["run", "--output-dir", str(output), "--source-revision", REVISION])

    assert code == errors.EXIT_USAGE
    line = usage_error(capsys)
    assert str(output) in line
    assert "already exists" in line
    assert snapshot(tmp_path) == before


def test_run_refuses_a_dangling_symlink_as_output_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "evidence"
    try:
        output.symlink_to(tmp_path / "nowhere")
    except (OSError, NotImplementedError) as exc:
        pytest.skip(f"symlinks unsupported here: {exc}")

    code = cli.main(["run", "--output-dir", str(output), "--source-revision", REVISION])

    assert code == errors.EXIT_USAGE
    assert str(output) in usage_error(capsys)
    assert not (tmp_path / "nowhere").exists()


def test_run_refuses_a_missing_parent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "no" / "such" / "evidence"

    code = cli.main(["run", "--output-dir", str(output), "--source-revision", REVISION])

    assert code == errors.EXIT_USAGE
    assert str(output.parent) in usage_error(capsys)
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("revision", ["nothex", "A" * 40, "a" * 39, "a" * 41, "g" * 40])
def test_run_refuses_a_malformed_source_revision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], revision: str
) -> None:
    output = tmp_path / "evidence"

    code = cli.main(["run", "--output-dir", str(output), "--source-revision", revision])

    assert code == errors.EXIT_USAGE
    assert f"--source-revision {revision!r}" in usage_error(capsys)
    assert not output.exists()
    assert list(tmp_path.iterdir()) == []


def test_run_outside_a_checkout_records_the_revision_as_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An sdist, a container image without .git: the run goes on, the revision is recorded as
    unknown (a free field), and a note on stderr says so before anything runs."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_SHA", raising=False)
    for var in ("GIT_DIR", "GIT_WORK_TREE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    from dcp_invariant import python_api

    given: list[str] = []

    def run_plan(*args: Any, revision: str, **kwargs: Any) -> Any:
        given.append(revision)
        raise cli.Interrupted(2)  # stop here: the suite itself is not this test's

    monkeypatch.setattr(python_api, "run_plan", run_plan)
    assert cli.main(["run", "--output-dir", str(tmp_path / "evidence")]) == 128 + 2

    assert given == ["unknown"]
    note = capsys.readouterr().err.splitlines()[0]
    assert note == (
        "dcp-invariant: note: no --source-revision, no $GITHUB_SHA and no git checkout here: "
        "provenance.json records the revision as 'unknown'"
    )


def test_run_refuses_a_malformed_github_sha(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GITHUB_SHA", "main")
    output = tmp_path / "evidence"

    assert cli.main(["run", "--output-dir", str(output)]) == errors.EXIT_USAGE

    assert "$GITHUB_SHA 'main'" in usage_error(capsys)
    assert not output.exists()


@pytest.mark.parametrize("timeout", ["0", "-5", "nan", "inf", "-inf", "soon"])
def test_run_refuses_a_bad_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], timeout: str
) -> None:
    output = tmp_path / "evidence"
    argv = ["run", "--output-dir", str(output), "--source-revision", REVISION]

    assert cli.main([*argv, f"--timeout={timeout}"]) == errors.EXIT_USAGE

    assert "--timeout" in usage_error(capsys)
    assert not output.exists()


def test_run_requires_an_output_dir(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--source-revision", REVISION]) == errors.EXIT_USAGE
    assert "--output-dir" in usage_error(capsys)


# The real run_suite, with RUNTIMES replaced, in a fresh interpreter. WorkerPool is made to exit
# so that, should the runtime check ever let this through, no scenario can start.
_UNREGISTERED = r"""
import sys
import dcp_invariant.suite.runner as runner
import dcp_invariant.runtimes as runtimes

def no_workers(*args, **kwargs):
    sys.exit(99)

runner.WorkerPool = no_workers
runtimes.RUNTIMES = {runtimes_value}
from dcp_invariant import cli
sys.exit(cli.main(["run", "--output-dir", sys.argv[1], "--source-revision", "a" * 40]))
"""


@pytest.mark.parametrize(
    ("runtimes_value", "registered"),
    [
        ("()", None),
        ('(runtimes.Runtime("0.0.1+fake", "0.0.1+fake", 1, "0" * 64, release="0.0.1"),)', "0.0.1"),
    ],
    ids=["none registered", "another registered"],
)
def test_run_refuses_an_unregistered_runtime(
    tmp_path: Path, runtimes_value: str, registered: str | None
) -> None:
    output = tmp_path / "evidence"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _UNREGISTERED.replace("{runtimes_value}", runtimes_value),
            str(output),
        ],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        cwd=tmp_path,
        check=False,
    )

    assert done.returncode == errors.EXIT_USAGE, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert line.startswith("dcp-invariant: error: ")
    installed = runtimes.installed_distribution()
    if installed is None:
        assert "torch is not installed" in line
    else:
        assert f"unregistered torch runtime {installed}/" in line
        assert "registered releases:" in line
        if registered is not None:
            assert registered in line
    assert not output.exists()
    assert list(tmp_path.iterdir()) == []


def test_module_entry_point_exits_with_the_cli_code(tmp_path: Path) -> None:
    # `python -m dcp_invariant` must hand main()'s code to the shell, not swallow it.
    missing = tmp_path / "missing"
    done = subprocess.run(
        [sys.executable, "-m", "dcp_invariant", "verify", str(missing)],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        cwd=tmp_path,
        check=False,
    )

    assert done.returncode == errors.EXIT_USAGE
    assert str(missing) in done.stderr


@pytest.mark.skipif(shutil.which("dcp-invariant") is None, reason="console script not on PATH")
def test_console_script_lists_the_scenarios(tmp_path: Path) -> None:
    done = subprocess.run(
        ["dcp-invariant", "list"],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        cwd=tmp_path,
        check=False,
    )

    assert done.returncode == errors.EXIT_OK
    assert [line.split()[0] for line in done.stdout.splitlines()] == list(plan.SCENARIO_NAMES)


# --- run --fixture: the plan's grammar is checked before anything starts -----------------------


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--fixture", "no_colon"], "is not MODULE:CALLABLE"),
        (["--fixture", "m:f", "--world-sizes", "1,x"], "comma-separated integers"),
        (["--fixture", "m:f", "--world-sizes", "0,1"], "distinct integers from 1 to 8"),
        (["--fixture", "m:f", "--world-sizes", "2,2"], "distinct integers from 1 to 8"),
        (["--fixture", "m:f", "--world-sizes", "16"], "distinct integers from 1 to 8"),
        (["--fixture", "m:f", "--steps-before", "0"], "steps before the save: 0"),
        (["--fixture", "m:f", "--steps-after", "-2"], "steps after: -2"),
        (["--world-sizes", "1,2"], "--world-sizes go with --fixture"),
        (["--steps-before", "2", "--steps-after", "2"], "--steps-before, --steps-after go with"),
        (["--fixture-arg", "width=1"], "--fixture-arg go with --fixture"),
        (["--rank-local", "data"], "--rank-local go with --fixture"),
        (["--fixture", "m:f", "--fixture-arg", "width"], "expected NAME=VALUE"),
        (["--fixture", "m:f", "--fixture-arg", "=1"], "expected NAME=VALUE"),
        (["--fixture", "m:f", "--fixture-arg", "w=1", "--fixture-arg", "w=2"], "given twice"),
        (["--fixture", "m:f", "--fixture-arg", "world_size=4"], "passes rank and world_size"),
        (["--fixture", "m:f", "--fixture-arg", "w=NaN"], "the value must be JSON"),
        (["--fixture", "m:f", "--fixture-arg", "w=" + "[" * 100000], "nested too deeply"),
        (["--fixture", "m:f", "--rank-local", "a.b"], "--rank-local 'a.b'"),
        (["--ignore-attr", "app.ema"], "--ignore-attr go with --fixture"),
        (["--cache-dir", "c"], "--cache-dir goes with --resume-with-torch RELEASE"),
        (["--fixture", "m:f", "--cache-dir", "c"], "--cache-dir goes with --resume-with-torch"),
        (["--fixture", "m:f", "--ignore-attr", "ema"], "--ignore-attr 'ema': give an attribute"),
        (["--fixture", "m:f", "--ignore-attr", "app.a b"], "--ignore-attr 'app.a b'"),
        (
            ["--fixture", "m:f", "--ignore-attr", "app.x", "--ignore-attr", "app.x"],
            "each path once",
        ),
    ],
)
def test_run_refuses_a_fixture_plan_outside_the_grammar(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str], message: str
) -> None:
    output = tmp_path / "evidence"
    code = cli.main(["run", "--output-dir", str(output), "--source-revision", REVISION, *arguments])
    assert code == errors.EXIT_USAGE
    assert message in usage_error(capsys)
    assert not output.exists()


IGNORED = ("--ignore-attr", "rng.numpy", "--ignore-attr", "app.ema")


def test_ignored_attributes_are_in_the_plan_sorted() -> None:
    args = cli.build_parser().parse_args(["run", "--output-dir", "o", "--fixture", "m:f", *IGNORED])
    the_plan = cli._run_plan(args)
    assert the_plan.ignored_attrs == ("app.ema", "rng.numpy")
    assert the_plan.to_record()["ignored_attrs"] == ["app.ema", "rng.numpy"]


@pytest.mark.parametrize(
    ("given", "value"),
    [("64", 64), ("true", True), ("[1, 2]", [1, 2]), ('"64"', "64"), ("tiny", "tiny"), ("", "")],
)
def test_a_fixture_arg_value_is_json_or_else_a_string(given: str, value: Any) -> None:
    args = cli.build_parser().parse_args(
        ["run", "--output-dir", "o", "--fixture", "m:f", "--fixture-arg", f"x={given}"]
    )
    assert cli._run_plan(args).arguments == {"x": value}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            ["--fixture", "m:f", "--fixture-arg", "a=" + "1" * 5000],
            "--fixture-arg a: the value holds an integer of more digits than Python reads "
            f"({sys.get_int_max_str_digits()}); fixture arguments take integers of at most 20 "
            "digits: pass a longer number as a string",
        ),
        (
            ["--fixture", "m:f", "--fixture-arg", "a=" + "9" * 21],
            "fixture argument a: the value must be JSON with integers of at most 20 digits",
        ),
        (
            ["--fixture", "m:f", "--fixture-arg", "lr=0.1"],
            "fixture argument lr: the value must be JSON without floats (0.1 is one), which the "
            "evidence does not record: pass it as a string (lr='\"0.1\"')",
        ),
        (
            ["--fixture", "m:f", "--fixture-arg", "a=" + "[" * 33 + "]" * 33],
            "fixture argument a: the value must be JSON nested at most 32 levels deep",
        ),
        (
            ["--fixture", "m" * 5000 + ":f"],
            f"fixture {'m' * 40!r}... is 5002 characters long, more than a module and callable "
            "can be named with (1024): give MODULE:CALLABLE of an importable module",
        ),
    ],
    ids=["5000 digits", "21 digits", "float", "33 deep", "5000-character module"],
)
def test_run_refuses_what_the_evidence_cannot_record_in_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], arguments: list[str], message: str
) -> None:
    """Each was a traceback, a crash when the artifact was written, or an artifact verify
    refuses; each is now refused before anything starts."""
    code = cli.main(
        ["run", "--output-dir", str(tmp_path / "out"), "--source-revision", REVISION, *arguments]
    )
    assert code == errors.EXIT_USAGE
    line = usage_error(capsys)
    assert message in line
    assert len(line) < 400  # the value is named, not echoed whole
    assert list(tmp_path.iterdir()) == []


def test_a_fixture_name_at_the_bound_is_taken_and_one_character_more_is_refused() -> None:
    """At the bound the name is left to the import to judge, as before the bound existed."""
    spec = "m" * (fixture_inputs.MAX_FIXTURE_SPEC_CHARS - 2) + ":f"
    assert plan.fixture_plan(spec).fixture == spec
    with pytest.raises(errors.PlanError, match="1025 characters long"):
        plan.fixture_plan("m" + spec)


def test_run_accepts_an_empty_output_dir_and_refuses_a_non_empty_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    # The refusal comes from the guard against starting the suite: the empty directory passed.
    with pytest.raises(AssertionError, match=r"reached runner\.run_suite"):
        cli.main(["run", "--output-dir", str(empty), "--source-revision", REVISION])
    (empty / "x").write_bytes(b"")
    assert cli.main(["run", "--output-dir", str(empty), "--source-revision", REVISION]) == 2
    assert "is not an empty directory" in usage_error(capsys)


def test_debug_adds_the_traceback_behind_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    arguments = [
        "run",
        "--output-dir",
        str(tmp_path / "o"),
        "--fixture",
        "m:f",
        "--world-sizes",
        "0",
    ]
    assert cli.main(arguments) == errors.EXIT_USAGE
    plain = capsys.readouterr().err
    assert len(plain.splitlines()) == 1 and "Traceback" not in plain
    assert cli.main(["--debug", *arguments]) == errors.EXIT_USAGE
    debugged = capsys.readouterr().err
    assert debugged.startswith(plain) and "Traceback (most recent call last)" in debugged


def test_what_comparing_scenarios_adds_is_printed_before_the_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A scenario that passes alone can fail against its siblings (rules.consistency), which
    only runs once all have finished: the console must not leave it at 'pass'."""
    from artifact_data import DATA_ARTIFACT, read_observations, read_provenance

    from dcp_invariant.evidence import rules
    from dcp_invariant.suite import runner

    observations = read_observations(DATA_ARTIFACT)
    # Another size for one file of a save that two sibling scenarios recorded too.
    observations["training_2_to_2"]["commit"]["files"][1]["size"] += 1
    kept = read_provenance(DATA_ARTIFACT)

    def fake_run_suite(
        *, run_plan: plan.Plan, timeout: float, on_finish: Any, guardian: Any, cache_dir: Any
    ) -> Any:
        for name in run_plan.names:
            reasons = rules.derive(name, observations[name], run_plan=run_plan)
            on_finish(runner.Finished(name, "fail" if reasons else "pass", 0.0, reasons, []))
        return runner.SuiteRun(
            run_plan, observations, kept["torch_distribution"], kept["torch_runtime"], kept["numpy"]
        )

    monkeypatch.setattr(runner, "run_suite", fake_run_suite)

    code = cli.main(["run", "--output-dir", str(tmp_path / "out"), "--source-revision", REVISION])

    out = capsys.readouterr().out.splitlines()
    assert code == errors.EXIT_FAIL
    assert any(line.startswith("pass  training_2_to_2") for line in out), out
    later = out.index("fail  training_2_to_2          compared with the other scenarios")
    assert out[later + 1].startswith("      - consistency: commit.files is not"), out
    assert out[-1].startswith("fail: 10 passed, 1 failed"), out
