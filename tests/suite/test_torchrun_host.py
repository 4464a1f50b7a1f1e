"""The torchrun host (dcp_invariant/suite/torchrun/host.py) without torch: the same driver on
the pool host and on a rank of a job gives the same observation; attempt 1 replays attempt 0 up
to the restart; a second launch's reshard replays the first launch's source and commit.

Tasks, the commit and the collectives are stand-ins; tests/suite/test_in_job.py runs real
torchrun jobs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dcp_invariant import canonical, errors, plan
from dcp_invariant.commit import CheckpointStore
from dcp_invariant.evidence.families.records import CommitRecord
from dcp_invariant.suite.pool import GroupOutcome
from dcp_invariant.suite.scenarios import DRIVERS, host, payloads
from dcp_invariant.suite.scenarios.commits import Interner
from dcp_invariant.suite.scenarios.common import ScenarioContext
from dcp_invariant.suite.torchrun import host as torchrun

FIXTURE = "pkg.mod:make_app"
RECEIPT, POINTER = "ab" * 32, "cd" * 32  # the digests the stand-in commit meets


def task(call: payloads.Call, rank: int, world_size: int) -> torchrun.TaskResult:
    """What the fixture tasks report, shortened: a training arm's record, or a resumed rank's."""
    if call.task == payloads.FIXTURE_TRAIN.ref:
        steps = [{"keys": {"app.w": "11"}, "loss": "0x1.0p-1"}]
        record = {"rank": rank, "losses_before": ["0x1.0p+0"], "saved": {"app.w": "10"}}
        return {"exit_code": 0, "record": {**record, "steps": steps}, "raised": None}
    if call.task == payloads.FIXTURE_NEVER_SAVES.ref:
        losses = {"losses_before": ["0x1.0p+0"], "losses_after": ["0x1.0p-1"]}
        return {"exit_code": 0, "record": {"rank": rank, **losses}, "raised": None}
    assert call.task == payloads.FIXTURE_RESUME.ref, call.task
    record = {"rank": rank, "generation": RECEIPT, "loaded": {"app.w": "10"}, "diffs": []}
    return {
        "exit_code": 0,
        "record": {**record, "steps": [], "payload": dict(call.payload)},
        "raised": None,
    }


def commit(
    store: CheckpointStore,
    label: str,
    intern: Interner,
    damage: Any = None,
    refused: tuple[str, str] | None = None,
) -> CommitRecord:
    return {
        "label": label,
        "sealed": True,
        "seal_error": None,
        "receipt": intern("receipt", RECEIPT),
        "files": [],
        "promoted": True,
        "refused": [],
        "candidate_retained": False,
        "pointer_before": intern("pointer", None),
        "pointer_after": intern("pointer", POINTER),
        "generations_before": 0,
        "generations_after": 1,
    }


class Pool:
    """The worker pool as the pool host uses it, each rank running :func:`task`."""

    timeout = 60.0

    def run_group(
        self, call: payloads.Call, world_size: int, workdir: Path, group: str
    ) -> GroupOutcome:
        results = [task(call, rank, world_size)["record"] for rank in range(world_size)]
        return GroupOutcome([0] * world_size, False, results, [])


POOL: Any = Pool()  # a WorkerPool to the pool host


class Job:
    """A job's collectives as rank 0 sees them: every other rank sent what this one did, but
    its rank; ``seen`` is whether each rank read the pointer rank 0 moved."""

    def __init__(self, world_size: int, seen: list[bool] | None = None) -> None:
        self.world_size = world_size
        self.seen = seen or [True] * world_size

    def gather(self, value: Any) -> list[Any]:
        if isinstance(value, bool):
            return [value and s for s in self.seen]
        return [_as_rank(value, rank) for rank in range(self.world_size)]

    def broadcast(self, value: Any) -> Any:
        return value


def _as_rank(result: Any, rank: int) -> Any:
    record = result["record"]
    return {**result, "record": None if record is None else {**record, "rank": rank}}


@pytest.fixture(autouse=True)
def stand_ins(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Both hosts run :func:`task` and :func:`commit`; the tasks run live are listed."""
    live: list[str] = []

    def traced(call: payloads.Call, rank: int, world_size: int) -> torchrun.TaskResult:
        live.append(call.task.rpartition(":")[2])
        return task(call, rank, world_size)

    monkeypatch.setattr(torchrun, "_task", traced)
    monkeypatch.setattr(torchrun, "commit", commit)
    monkeypatch.setattr(host, "commit", commit)
    return live


def in_job_plan(world_size: int, resumed_from: int | None = None) -> plan.Plan:
    return plan.in_job_plan(FIXTURE, plan.Launch(1, world_size, "gloo", resumed_from))


def run(
    the_plan: plan.Plan, name: str, on: host.Host, workdir: Path
) -> tuple[ScenarioContext, dict[str, Any]]:
    (workdir / "ckpt").mkdir(parents=True, exist_ok=True)
    ctx = ScenarioContext(the_plan.scenario(name), on, workdir, FIXTURE, the_plan)
    return ctx, ctx.finished(DRIVERS[ctx.scenario.family](ctx))


def rank0(
    tmp: Path, replay: list[torchrun.Entry] | None, world_size: int = 2, **kw: Any
) -> torchrun.TorchrunHost:
    job = kw.pop("job", Job(world_size))
    return torchrun.TorchrunHost(
        0, world_size, 60.0, tmp / "commit.json", replay, collectives=job, **kw
    )


def attempt0(tmp: Path, name: str, world_size: int = 2, **kw: Any) -> list[torchrun.Entry]:
    """Attempt 0 up to the restart; its records, as the file between attempts holds them."""
    first = rank0(tmp, None, world_size, **kw)
    with pytest.raises(torchrun.Restarting):
        run(in_job_plan(world_size), name, first, tmp)
    return torchrun.entries(canonical.loads(canonical.dumps(first.recorded)))


@pytest.mark.parametrize("name", ["resume_2", "async_resume_2"])
def test_a_rank_of_a_job_observes_what_the_pool_observes(
    tmp_path: Path, stand_ins: list[str], name: str
) -> None:
    the_plan = in_job_plan(2)
    _, on_pool = run(the_plan, name, host.PoolHost(POOL), tmp_path / "pool")

    recorded = attempt0(tmp_path / "job", name)
    # The arms, then the restart.
    assert stand_ins == ["fixture_train", "fixture_never_saves", "fixture_train"]
    assert [e.get("group", e.get("commit")) for e in recorded] == [
        "reference",
        "never_saves",
        "repeat",
        the_plan.baseline_label,
    ]
    assert (tmp_path / "job" / "commit.json").is_file()  # what a second launch looks for
    _, in_job = run(the_plan, name, rank0(tmp_path / "job", recorded), tmp_path / "job")

    assert stand_ins[3:] == ["fixture_resume"]  # after the restart: the loading ranks alone
    assert in_job == on_pool
    assert in_job["target"]["ranks"][1]["generation"] == "receipt-1"  # as rank 0 labelled it
    assert in_job["left_running"] == [] and in_job["errors"] == []


def test_a_rank_that_read_another_pointer_after_the_commit_is_an_error(tmp_path: Path) -> None:
    recorded = attempt0(tmp_path, "resume_2", job=Job(2, seen=[True, False]))
    _, obs = run(in_job_plan(2), "resume_2", rank0(tmp_path, recorded), tmp_path)

    assert obs["errors"] == [
        "rank 1: after the commit it read another pointer than the one rank 0 moved: the "
        "shared filesystem does not show every node the same files"
    ]
    assert obs["commit"]["promoted"] is True and obs["target"] is not None


def test_a_second_launch_reshards_the_first_launchs_source_and_commit(
    tmp_path: Path, stand_ins: list[str]
) -> None:
    first = tmp_path / "resume_2"
    recorded = attempt0(first, "resume_2")
    stand_ins.clear()
    the_plan = in_job_plan(4, resumed_from=2)
    second = rank0(tmp_path, torchrun.resharded(recorded), 4, source=first)
    _, obs = run(the_plan, "reshard_2_to_4", second, tmp_path / "reshard_2_to_4")

    assert stand_ins == ["fixture_resume"]  # the source and its commit are the first launch's
    # The source is the first launch's reference arm, as a reshard's is on the pool.
    assert obs["source"] == recorded[0]["outcome"]
    assert obs["commit"] == recorded[3]["record"]
    ranks = obs["target"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert {r["generation"] for r in ranks} == {"receipt-1"}
    loaded = ranks[0]["payload"]
    assert (loaded["store"], loaded["reference"]) == (
        str(first / "ckpt"),
        str(first / "snapshots" / "reference"),
    )
    assert obs["left_out"] == [] and obs["errors"] == []
    # The same driver on the pool: an observation of the same shape.
    pool_plan = plan.fixture_plan(FIXTURE, (2, 4))
    _, on_pool = run(pool_plan, "reshard_2_to_4", host.PoolHost(POOL), tmp_path / "pool")
    assert set(on_pool) == set(obs)


def test_records_another_attempt_did_not_make_are_refused(tmp_path: Path) -> None:
    recorded = attempt0(tmp_path, "resume_2")
    with pytest.raises(errors.InJobError, match="record 1 is not group reference"):
        run(in_job_plan(2), "resume_2", rank0(tmp_path, recorded[1:]), tmp_path)
    with pytest.raises(errors.InJobError, match="replayed 4 of the 5 records"):
        run(in_job_plan(2), "resume_2", rank0(tmp_path, [*recorded, recorded[0]]), tmp_path)
    with pytest.raises(errors.InJobError, match="another version"):
        torchrun.entries({"reference": {}, "repeat": {}, "pointer_seen": True})
    with pytest.raises(errors.InJobError, match="committed no checkpoint"):
        torchrun.resharded(recorded[:3])


def test_a_failed_commit_stops_every_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: Any) -> CommitRecord:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(torchrun, "commit", refused)
    on = rank0(tmp_path, None)
    with pytest.raises(errors.InJobError, match="rank 0 could not commit step-3: OSError"):
        run(in_job_plan(2), "resume_2", on, tmp_path)
    other = torchrun.TorchrunHost(1, 2, 60.0, tmp_path / "c.json", None, collectives=Job(2))
    store = CheckpointStore(tmp_path / "ckpt")
    with pytest.raises(errors.InJobError, match=r"rank 0 could not commit step-3$"):
        other.commit(store, "step-3", Interner(), None)
