"""The in-job worker's torch-free parts: what torchrun must have told it, the device per backend,
the plan it records. tests/suite/test_torchrun_host.py runs its host without torch, and
tests/suite/test_in_job.py runs it in real torchrun jobs."""

from __future__ import annotations

from pathlib import Path

import pytest

from dcp_invariant import cli, errors, plan
from dcp_invariant.suite.torchrun import in_job

TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_MAX_RESTARTS": "1",
}


def test_a_worker_reads_its_place_in_the_job() -> None:
    job = in_job.JobEnvironment.read(TORCHRUN)
    assert (job.rank, job.world_size, job.local_rank, job.nodes) == (3, 4, 1, 2)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"RANK": ""}, "RANK is not set: launch it with torchrun --max-restarts=1"),
        ({"TORCHELASTIC_MAX_RESTARTS": "3"}, "launch it with --max-restarts=1"),
        ({"TORCHELASTIC_RESTART_COUNT": "2"}, "the check makes exactly one"),
        ({"LOCAL_WORLD_SIZE": "3"}, "give every node the same --nproc-per-node"),
    ],
)
def test_a_job_launched_otherwise_is_bad_input(change: dict[str, str], says: str) -> None:
    with pytest.raises(errors.InJobError, match=says) as caught:
        in_job.JobEnvironment.read({**TORCHRUN, **change}).expect_one_restart()
    assert caught.value.exit_code == errors.EXIT_USAGE
    assert "\n" not in str(caught.value)


def test_nccl_puts_each_rank_on_its_own_gpu_and_gloo_on_the_cpu() -> None:
    assert in_job.device_for("gloo", 3, 0) == "cpu"
    assert in_job.device_for("nccl", 1, 2) == "cuda:1"
    with pytest.raises(errors.InJobError, match="local rank 2 has no CUDA device"):
        in_job.device_for("nccl", 2, 2)


def test_the_launch_id_is_a_safe_file_name_part() -> None:
    assert in_job.run_id({"TORCHELASTIC_RUN_ID": "job-17.a"}) == "job-17.a"
    assert in_job.run_id({"TORCHELASTIC_RUN_ID": "../x y"}) == ".._x_y"
    assert in_job.run_id({}) == "none"


def test_a_resumed_check_refuses_a_restart() -> None:
    job = in_job.JobEnvironment.read({**TORCHRUN, "TORCHELASTIC_RESTART_COUNT": "1"})
    with pytest.raises(errors.InJobError, match="makes no restart"):
        job.expect_no_restart()


def test_a_second_launch_finds_the_first_launchs_commit(tmp_path: Path) -> None:
    with pytest.raises(errors.InJobError, match="holds 0 committed first launches"):
        in_job.first_launch(tmp_path)
    committed = tmp_path / "resume_2" / in_job.STATE_DIR
    committed.mkdir(parents=True)
    (committed / in_job.COMMIT_FILE).write_text("{}", encoding="utf-8")
    assert in_job.first_launch(tmp_path) == (2, tmp_path / "resume_2")


def test_a_resumed_plan_is_one_reshard_from_the_first_launchs_world_size() -> None:
    launch = plan.Launch(nodes=1, nproc_per_node=4, backend="gloo", resumed_from=2)
    the_plan = plan.in_job_plan("pkg.mod:make_app", launch)
    assert the_plan.names == ("reshard_2_to_4",)
    assert plan.plan_from_record(the_plan.to_record()) == the_plan
    with pytest.raises(errors.PlanError, match="another than this launch's 4"):
        plan.in_job_plan("pkg.mod:make_app", plan.Launch(1, 4, "gloo", resumed_from=4))


def test_the_plan_records_the_launch_and_reads_back() -> None:
    launch = plan.Launch(nodes=2, nproc_per_node=4, backend="nccl")
    the_plan = plan.in_job_plan("pkg.mod:make_app", launch, 5, 2, {"width": 8})
    assert the_plan.names == ("resume_8", "async_resume_8")
    record = the_plan.to_record()
    assert record["launch"] == {
        "backend": "nccl",
        "nodes": 2,
        "nproc_per_node": 4,
        "resumed_from": None,
    }
    assert plan.plan_from_record(record) == the_plan
    # A record whose scenarios its launch does not give is refused.
    with pytest.raises(errors.PlanError, match="are not the ones its launch gives"):
        plan.plan_from_record({**record, "scenarios": ["resume_4", "async_resume_4"]})
    with pytest.raises(errors.PlanError, match="backend 'mpi'"):
        plan.in_job_plan("pkg.mod:make_app", plan.Launch(1, 1, "mpi"))  # type: ignore[arg-type]


def test_a_fixture_plan_records_no_launch() -> None:
    # Fixture artifacts stay byte-identical: their plan record has no new key.
    assert "launch" not in plan.fixture_plan("pkg.mod:make_app").to_record()


def test_in_job_outside_torchrun_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in TORCHRUN:
        monkeypatch.delenv(name, raising=False)
    code = cli.main(
        [
            "in-job",
            "--fixture",
            "pkg.mod:make_app",
            "--checkpoint-dir",
            str(tmp_path / "ckpt"),
            "--output-dir",
            str(tmp_path / "out"),
            "--source-revision",
            "0" * 40,
        ]
    )
    err = capsys.readouterr().err
    assert code == errors.EXIT_USAGE
    assert err.count("\n") == 1 and "launch it with torchrun" in err
    assert list(tmp_path.iterdir()) == []
