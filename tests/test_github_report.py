"""The job summary and step outputs the composite action publishes, derived from an artifact."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from dcp_invariant import cli, github, plan
from dcp_invariant.evidence import schema
from dcp_invariant.evidence.verify import verify_artifact


def _fail_corrupt_shard(observations) -> None:
    observations["corrupt_shard"]["candidate"]["promoted"] = True


def test_a_passing_artifact_reports_pass_with_its_manifest_digest(data_artifact: Path) -> None:
    out = github.outputs(data_artifact, verify_artifact(data_artifact))
    manifest = (data_artifact / schema.MANIFEST_FILE).read_bytes()
    assert out == {
        "verdict": "pass",
        "passed": "11",
        "failed": "0",
        "manifest-sha256": hashlib.sha256(manifest).hexdigest(),
        "evidence-dir": str(data_artifact.resolve()),
    }


def test_a_failing_scenario_is_counted_and_its_reason_shown(rebuild) -> None:
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


def test_reasons_cannot_break_the_table_or_inject_markup(rebuild) -> None:
    def hostile(observations) -> None:
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
    with pytest.raises(github.ArtifactNameError):
        github.artifact_name(bad, "2.13.0", {})


def test_the_default_artifact_name_is_unique_per_matrix_job() -> None:
    env = {"GITHUB_JOB": "integration", "RUNNER_OS": "Windows", "GITHUB_RUN_ATTEMPT": "2"}
    name = github.artifact_name("", "2.11.0", env)
    assert name.startswith("dcp-invariant-integration-Windows-py3.")
    assert name.endswith("-torch2.11.0-attempt2")
    assert github.artifact_name("", "2.13.0", env) != name
    assert github.artifact_name("", "2.11.0", {**env, "RUNNER_OS": "Linux"}) != name
    assert github.artifact_name("mine", "2.11.0", env) == "mine"


def test_outputs_refuse_multiline_values(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="spans lines"):
        github.write_outputs(tmp_path / "out", {"verdict": "pass\nverdict=fail"})


def test_the_cli_appends_to_the_runner_files_and_never_fails_the_step(
    rebuild, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = rebuild(_fail_corrupt_shard)
    summary, output = tmp_path / "summary.md", tmp_path / "output"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_OUTPUT", str(output))
    monkeypatch.setenv("GITHUB_JOB", "quality")
    assert cli.main(["github-report", "--artifact-dir", str(directory)]) == cli.EXIT_OK
    assert summary.read_text().startswith(
        "earlier step\n## dcp-invariant: fail (10 passed, 1 failed)"
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
    assert code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "artifact-name 'a/b'" in err
    assert not output.exists()


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
