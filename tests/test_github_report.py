"""The job summary and step outputs the composite action publishes, derived from an artifact."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from artifact_data import Observations, Rebuild

from dcp_invariant import cli, errors, github, plan
from dcp_invariant.evidence import schema
from dcp_invariant.evidence.verify import Verification, verify_artifact

OUTPUTS = ["verdict", "passed", "failed", "valid", "problems", "manifest-sha256", "evidence-dir"]


def read_outputs(path: Path) -> dict[str, str]:
    """``$GITHUB_OUTPUT`` as the runner reads it: ``key=value`` or ``key<<DELIMITER`` lines."""
    values: dict[str, str] = {}
    lines = path.read_text(encoding="utf-8").split("\n")
    assert lines.pop() == ""
    while lines:
        line = lines.pop(0)
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, delimiter = line.split("<<", 1)
            end = lines.index(delimiter)
            values[key] = "\n".join(lines[:end])
            del lines[: end + 1]
        else:
            key, value = line.split("=", 1)
            values[key] = value
    return values


def _fail_corrupt_shard(observations: Observations) -> None:
    observations["corrupt_shard"]["candidate"]["promoted"] = True


def test_a_passing_artifact_reports_pass_with_its_manifest_digest(data_artifact: Path) -> None:
    out = github.outputs(data_artifact, verify_artifact(data_artifact))
    manifest = (data_artifact / schema.MANIFEST_FILE).read_bytes()
    assert out == {
        "verdict": "pass",
        "passed": "11",
        "failed": "0",
        "valid": "true",
        "problems": "0",
        "manifest-sha256": hashlib.sha256(manifest).hexdigest(),
        "evidence-dir": str(data_artifact.resolve()),
    }


def test_a_failing_scenario_is_counted_and_its_reason_shown(rebuild: Rebuild) -> None:
    directory = rebuild(_fail_corrupt_shard)
    report = verify_artifact(directory)
    out = github.outputs(directory, report)
    assert (out["verdict"], out["passed"], out["failed"]) == ("fail", "10", "1")
    markdown = github.summary(directory, report)
    [row] = [line for line in markdown.splitlines() if line.startswith("| `corrupt_shard`")]
    assert "| fail |" in row and "was promoted" in row
    assert markdown.count("\n| `") == len(plan.SCENARIO_NAMES)


def test_an_invalid_artifact_fails_and_lists_its_problems(artifact_copy: Path) -> None:
    (artifact_copy / schema.SUMMARY_FILE).write_bytes(b"{}\n")
    report = verify_artifact(artifact_copy)
    assert github.outputs(artifact_copy, report)["verdict"] == "fail"
    markdown = github.summary(artifact_copy, report)
    assert "<details><summary>The artifact is invalid" in markdown
    assert "summary.json" in markdown


def test_a_missing_artifact_fails_with_no_manifest(tmp_path: Path) -> None:
    missing = tmp_path / "never-written"
    out = github.outputs(missing, github.report_for(missing))
    assert (out["verdict"], out["passed"], out["failed"], out["manifest-sha256"]) == (
        "fail",
        "0",
        "11",
        "",
    )
    assert "did not write one" in github.summary(missing, None)


def test_reasons_cannot_break_the_table_or_inject_markup(rebuild: Rebuild) -> None:
    def hostile(observations: Observations) -> None:
        observations["training_1_to_1"]["errors"] = ["a | b <script>x</script>\nnext " + "y" * 400]

    directory = rebuild(hostile)
    markdown = github.summary(directory, verify_artifact(directory))
    [row] = [line for line in markdown.splitlines() if line.startswith("| `training_1_to_1`")]
    assert "a \\| b &lt;script&gt;" in row
    assert "<script>" not in markdown
    assert row.count(" | ") == 2  # still three cells
    assert len(row) < github.MAX_REASON_CHARS + 80


@pytest.mark.parametrize("bad", ["a/b", "a:b", 'a"b', "a\nb", "x" * 201])
def test_an_unusable_artifact_name_is_refused(bad: str) -> None:
    with pytest.raises(errors.ArtifactNameError):
        github.artifact_name(bad, "2.13.0", {})


def test_the_default_artifact_name_is_unique_per_matrix_job() -> None:
    env = {
        "GITHUB_JOB": "integration",
        "RUNNER_OS": "Windows",
        "RUNNER_ARCH": "X64",
        "ImageOS": "win25",
        "GITHUB_RUN_ATTEMPT": "2",
    }
    name = github.artifact_name("", "2.11.0", env)
    assert name.startswith("dcp-invariant-integration-Windows-X64-win25-py3.")
    assert name.endswith("-torch2.11.0-attempt2")
    assert github.artifact_name("", "2.13.0", env) != name
    assert github.artifact_name("", "2.11.0", {**env, "RUNNER_OS": "Linux"}) != name
    # One OS family, two runners: the image and the architecture keep the names apart.
    assert github.artifact_name("", "2.11.0", {**env, "ImageOS": "win22"}) != name
    assert github.artifact_name("", "2.11.0", {**env, "RUNNER_ARCH": "ARM64"}) != name
    assert github.artifact_name("mine", "2.11.0", env) == "mine"
    # A second use of the action in the job: a name of its own; the first keeps the plain one.
    assert github.artifact_name("", "2.11.0", env, use=2) == f"{name}-use2"
    assert github.artifact_name("", "2.11.0", env, use=1) == name


def test_a_multiline_value_cannot_inject_another_output(tmp_path: Path) -> None:
    github.write_outputs(tmp_path / "out", {"verdict": "pass\nverdict=fail", "valid": "true"})

    assert read_outputs(tmp_path / "out") == {"verdict": "pass\nverdict=fail", "valid": "true"}


def test_the_cli_appends_to_the_runner_files_and_never_fails_the_step(
    rebuild: Rebuild, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = rebuild(_fail_corrupt_shard)
    summary, output = tmp_path / "summary.md", tmp_path / "output"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_OUTPUT", str(output))
    monkeypatch.setenv("GITHUB_JOB", "quality")
    assert cli.main(["github-report", "--artifact-dir", str(directory)]) == errors.EXIT_OK
    assert summary.read_text().startswith(
        "earlier step\n## dcp-invariant: fail: 10 passed, 1 failed"
    )
    values = dict(line.split("=", 1) for line in output.read_text().splitlines())
    assert values["verdict"] == "fail"
    assert values["artifact-name"].startswith("dcp-invariant-quality-")


def test_the_cli_refuses_a_bad_artifact_name_before_writing(
    data_artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "output"
    code = cli.main(
        [
            "github-report",
            "--artifact-dir",
            str(data_artifact),
            "--artifact-name",
            "a/b",
            "--output-file",
            str(output),
        ]
    )
    assert code == errors.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "artifact-name 'a/b'" in err
    assert not output.exists()


@pytest.mark.parametrize("use", ["-1", "0"])
def test_the_cli_refuses_a_use_below_1_before_writing(
    data_artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], use: str
) -> None:
    """The action counts its uses in a job from 1; -1 was taken and gave the first use's name,
    which the upload then refuses as taken."""
    output, summary = tmp_path / "output", tmp_path / "summary.md"
    code = cli.main(
        [
            "github-report",
            "--artifact-dir",
            str(data_artifact),
            "--use",
            use,
            "--output-file",
            str(output),
            "--summary-file",
            str(summary),
        ]
    )
    assert code == errors.EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"dcp-invariant: error: --use {use}: which use of the action in the job this is, counted "
        "from 1 (the action's venv step gives it): pass 1 or more\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("use", [0, -1, True, "2"])
def test_artifact_name_refuses_a_use_that_is_not_a_count(use: object) -> None:
    with pytest.raises(errors.UseNumberError, match="pass 1 or more"):
        github.artifact_name("mine", "2.13.0", {}, use=use)  # type: ignore[arg-type]


def test_the_report_reads_but_never_changes_the_artifact(
    data_artifact: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(data_artifact, copy)
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    cli.main(
        [
            "github-report",
            "--artifact-dir",
            str(copy),
            "--output-file",
            str(tmp_path / "o"),
            "--summary-file",
            str(tmp_path / "s"),
        ]
    )
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before


# --- hostile and broken artifacts: bounded, never a crash, all outputs or none --------------


def _report(directory: Path, tmp_path: Path) -> tuple[int, str, dict[str, str]]:
    summary, output = tmp_path / "summary.md", tmp_path / "output"
    code = cli.main(
        [
            "github-report",
            "--artifact-dir",
            str(directory),
            "--summary-file",
            str(summary),
            "--output-file",
            str(output),
        ]
    )
    return code, summary.read_text(encoding="utf-8"), read_outputs(output)


def test_an_invalid_artifact_whose_scenarios_pass_is_headlined_invalid(
    artifact_copy: Path, tmp_path: Path
) -> None:
    # An edit the manifest no longer covers: every scenario still derives "pass".
    path = artifact_copy / schema.PROVENANCE_FILE
    path.write_bytes(path.read_bytes().replace(b"3.11.7", b"3.11.8"))

    code, markdown, values = _report(artifact_copy, tmp_path)

    assert code == errors.EXIT_OK
    assert markdown.startswith("## dcp-invariant: invalid artifact (1 problems)\n")
    assert "passed, 0 failed" not in markdown
    assert (values["verdict"], values["valid"], values["problems"]) == ("fail", "false", "1")
    assert (values["passed"], values["failed"]) == ("11", "0")


def test_every_output_is_written_for_a_missing_artifact(tmp_path: Path) -> None:
    code, markdown, values = _report(tmp_path / "never-written", tmp_path)

    assert code == errors.EXIT_OK
    assert list(values) == [*OUTPUTS, "artifact-name"]
    assert (values["valid"], values["problems"], values["manifest-sha256"]) == ("false", "1", "")
    assert markdown.startswith("## dcp-invariant: no artifact\n")


def test_a_path_with_a_newline_is_reported_whole(artifact_copy: Path, tmp_path: Path) -> None:
    directory = tmp_path / "evi\ndence"
    artifact_copy.rename(directory)

    code, markdown, values = _report(directory, tmp_path)

    assert code == errors.EXIT_OK
    assert list(values) == [*OUTPUTS, "artifact-name"]
    assert values["evidence-dir"] == str(directory.resolve())
    assert values["verdict"] == "pass"
    assert markdown.startswith("## dcp-invariant: pass: 11 passed, 0 failed")


def test_a_path_with_undecodable_bytes_is_reported_escaped(
    artifact_copy: Path, tmp_path: Path
) -> None:
    raw = os.path.join(os.fsencode(tmp_path), b"evidence-\xff")
    try:
        os.rename(artifact_copy, raw)
    except (OSError, ValueError) as exc:
        pytest.skip(f"this filesystem refuses non-UTF-8 names: {exc}")
    directory = Path(os.fsdecode(raw))

    code, _, values = _report(directory, tmp_path)

    assert code == errors.EXIT_OK
    assert values["evidence-dir"].endswith("evidence-\\xff")
    assert values["verdict"] == "pass"


def test_an_unwritable_output_file_writes_nothing_and_exits_0(
    data_artifact: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = tmp_path / "summary.md"
    code = cli.main(
        [
            "github-report",
            "--artifact-dir",
            str(data_artifact),
            "--summary-file",
            str(summary),
            "--output-file",
            str(tmp_path),  # a directory: cannot be opened for appending
        ]
    )

    assert code == errors.EXIT_OK
    assert "cannot write the report" in capsys.readouterr().err
    assert not summary.exists()


def test_a_huge_manifest_is_neither_read_nor_hashed(artifact_copy: Path, tmp_path: Path) -> None:
    manifest = artifact_copy / schema.MANIFEST_FILE
    with open(manifest, "r+b") as f:
        f.truncate(2 << 30)  # sparse: 2 GiB that take no disk

    started = time.monotonic()
    _, markdown, values = _report(artifact_copy, tmp_path)

    assert time.monotonic() - started < 20
    assert values["manifest-sha256"] == ""
    assert values["valid"] == "false"
    assert "manifest.sha256: 2147483648 bytes, over the" in markdown


def test_a_manifest_is_hashed_as_streamed_bytes(data_artifact: Path) -> None:
    raw = (data_artifact / schema.MANIFEST_FILE).read_bytes()
    assert github.manifest_sha256(data_artifact) == hashlib.sha256(raw).hexdigest()


def test_a_symlinked_or_special_manifest_is_not_hashed(artifact_copy: Path, tmp_path: Path) -> None:
    manifest = artifact_copy / schema.MANIFEST_FILE
    manifest.unlink()
    if hasattr(os, "mkfifo"):
        os.mkfifo(manifest)  # opening it for reading would block without O_NONBLOCK
        assert github.manifest_sha256(artifact_copy) == ""
        manifest.unlink()
    try:
        os.symlink(tmp_path / "elsewhere", manifest)
    except (OSError, NotImplementedError) as exc:
        pytest.skip(f"symlinks unsupported here: {exc}")
    (tmp_path / "elsewhere").write_bytes(b"x")
    assert github.manifest_sha256(artifact_copy) == ""


def test_the_summary_stays_under_githubs_limit(data_artifact: Path) -> None:
    report = verify_artifact(data_artifact)
    report.problems = [
        f"observations/x.json: unknown key 'k{i}' " + "y" * 200 for i in range(100_000)
    ]

    markdown = github.summary(data_artifact, report)

    assert len(markdown.encode("utf-8")) <= github.MAX_SUMMARY_BYTES
    assert markdown.startswith("## dcp-invariant: invalid artifact (100000 problems)")
    assert "more lines left out" in markdown
    assert markdown.count("<details>") == markdown.count("</details>") == 1
    assert markdown.count("\n| `") == len(plan.SCENARIO_NAMES)  # the table is whole


def test_a_100000_key_observation_gives_a_bounded_summary(
    artifact_copy: Path, tmp_path: Path
) -> None:
    rel = schema.observation_file("training_1_to_1")
    keys = ",".join(f'"{i:05d}":0' for i in range(100_000))
    (artifact_copy / rel).write_bytes(b"{" + keys.encode() + b"}\n")

    _, markdown, values = _report(artifact_copy, tmp_path)

    assert len(markdown.encode("utf-8")) <= github.MAX_SUMMARY_BYTES
    assert values["valid"] == "false"
    assert int(values["problems"]) > 1000


def test_github_report_stops_quietly_when_stdout_is_closed(data_artifact: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys\n"
            "r, w = os.pipe(); os.close(r); os.dup2(w, 1)\n"
            "from dcp_invariant import cli\n"
            f"sys.exit(cli.main(['github-report', '--artifact-dir', {str(data_artifact)!r}]))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")},
        check=False,
    )

    assert done.stderr == ""
    assert done.returncode == errors.EXIT_OK


def test_summary_of_a_report_with_no_results(tmp_path: Path) -> None:
    report = Verification(problems=["x: not a directory"])
    markdown = github.summary(tmp_path, report)
    assert markdown.startswith("## dcp-invariant: invalid artifact (1 problems)")
