"""Live tests of ``run --fixture``: real training loops in real Gloo groups, resumed through DCP.

``fixture_loops`` (beside this file's parent) holds one correct loop and one buggy variant per
resume bug users report; each must fail with a diagnosis that names the right key or cause.
Scenario subsets run in-process to keep the suite short; the CLI runs check exit codes, the
console and the artifact as a user sees them.
"""

from __future__ import annotations

import importlib
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import cross_machine
import fixture_runs
import pytest
from cli_runs import REVISION, run_cli

import dcp_invariant
from dcp_invariant import canonical, plan
from dcp_invariant.evidence import rules, schema
from dcp_invariant.evidence.diagnosis import APP_ROUND_TRIP
from dcp_invariant.evidence.verify import verify_artifact
from dcp_invariant.suite import runner

pytestmark = pytest.mark.live
# The tests of the module's one run go to one pytest-xdist worker (--dist loadgroup), so that
# run is made once.
SHARES_EXAMPLE_RUN = pytest.mark.xdist_group("example_run")

TESTS = Path(__file__).resolve().parent.parent
REPOSITORY = TESTS.parent

# The example's artifact directory and the CLI run that wrote it.
ExampleRun = tuple[Path, subprocess.CompletedProcess[str]]


def run_fixture(
    fixture: str, out: Path, *extra: str, cwd: Path = TESTS
) -> subprocess.CompletedProcess[str]:
    """``run --fixture FIXTURE --world-sizes 1`` into ``out``, as a user runs it from ``cwd``."""
    return run_cli(
        "run",
        "--fixture",
        fixture,
        "--world-sizes",
        "1",
        *extra,
        "--output-dir",
        str(out),
        "--source-revision",
        REVISION,
        cwd=cwd,
    )


def derive(
    fixture: str,
    names: list[str],
    world_sizes: tuple[int, ...] = (1, 2),
    rank_local: tuple[str, ...] = (),
    module: str = "fixture_loops",
) -> dict[str, list[str]]:
    return fixture_runs.run(f"{module}:{fixture}", names, world_sizes, rank_local)[0]


# --- the example a user copies, through the CLI ------------------------------------------------


@pytest.fixture(scope="module")
def example_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> ExampleRun:
    out = tmp_path_factory.mktemp("example")  # an existing empty directory, as `mktemp -d` gives
    proc = run_cli(
        "run",
        "--fixture",
        "examples.mlp_fixture:fixture",
        "--output-dir",
        str(out),
        "--source-revision",
        REVISION,
        cwd=REPOSITORY,
    )
    return out, proc


@SHARES_EXAMPLE_RUN
def test_the_example_fixture_holds_at_every_world_size(
    example_run: ExampleRun,
) -> None:
    out, proc = example_run
    assert proc.returncode == 0, proc.stderr
    names = [
        "resume_1",
        "resume_2",
        "reshard_1_to_2",
        "reshard_2_to_1",
        "async_resume_1",
        "async_resume_2",
        "async_staged_resume_2",
        "async_process_resume_1",
        "elastic_restart_2_to_2",
    ]
    for name in names:
        assert re.search(rf"^pass\s+{name}\s", proc.stdout, re.M), proc.stdout
    provenance = canonical.loads((out / schema.PROVENANCE_FILE).read_bytes())
    assert provenance["schema_version"] == schema.FIXTURE_SCHEMA_VERSION
    assert provenance["plan"] == {
        "fixture": "examples.mlp_fixture:fixture",
        "fixture_args": {},
        "kind": "fixture",
        "rank_local": [],
        "scenarios": names,
        "steps_after": 3,
        "steps_before": 3,
        "world_sizes": [1, 2],
    }
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert files == list(schema.artifact_files(names))


@SHARES_EXAMPLE_RUN
def test_the_example_artifact_verifies_offline_and_records_every_key(
    example_run: ExampleRun,
) -> None:
    out, _ = example_run
    report = verify_artifact(out)
    assert report.valid and report.passed, report.problems
    assert report.run_plan.kind == "fixture"
    obs = canonical.loads((out / schema.observation_file("resume_2")).read_bytes())
    saved = obs["reference"]["ranks"][0]["saved"]
    assert "app.model.0.weight" in saved and saved["app.model.0.weight"].startswith("float64[")
    assert any(".momentum_buffer" in key for key in saved), sorted(saved)
    loaded = [r["loaded"] for r in obs["target"]["ranks"]]
    assert loaded == [r["saved"] for r in obs["reference"]["ranks"]]


@SHARES_EXAMPLE_RUN
def test_check_writes_what_the_cli_wrote_for_the_example(
    example_run: ExampleRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One code path, and a run that repeats itself: check()'s artifact is the CLI's, byte for
    byte, every file of it (observations, verdicts, provenance, manifest)."""
    cli, _ = example_run
    monkeypatch.syspath_prepend(str(REPOSITORY))  # where the CLI run found examples/
    # Given as the callable, which check() names as the CLI's MODULE:CALLABLE.
    fixture = importlib.import_module("examples.mlp_fixture").fixture
    report = dcp_invariant.check(fixture, output_dir=tmp_path / "api", source_revision=REVISION)

    assert report.passed, str(report)
    assert report.artifact == tmp_path / "api"
    assert [r.verdict for r in report.results.values()] == ["pass"] * len(report.results)
    assert report.diagnoses == ()
    names = verify_artifact(cli).run_plan.names
    assert tuple(report.results) == names
    for rel in schema.artifact_files(names):
        assert (report.artifact / rel).read_bytes() == (cli / rel).read_bytes(), rel


# --- one buggy loop per cause; each diagnosis names the key or the cause ----------------------


def test_an_optimizer_loaded_the_naive_way_is_named_with_the_fix() -> None:
    reasons = derive("optimizer_state_naive", ["resume_1"])["resume_1"]
    assert any(
        r.startswith("did not round-trip through DCP: rank 0: app.optim.state.")
        and "missing after load" in r
        for r in reasons
    ), reasons
    assert any("get_state_dict / set_state_dict" in r for r in reasons), reasons
    assert not any(r.startswith("state outside state_dict()") for r in reasons), reasons


@pytest.mark.parametrize(
    ("fixture", "named"),
    [
        ("rng_outside_state", "keys that differ first: app.model."),
        ("cursor_outside_state", "keys that differ first: app.model."),
        ("scheduler_outside_state", "app.optim.param_groups.0.lr"),
    ],
)
def test_state_outside_state_dict_is_the_cause_when_loaded_equals_saved(
    fixture: str, named: str
) -> None:
    reasons = derive(fixture, ["resume_1"])["resume_1"]
    outside = [r for r in reasons if r.startswith("state outside state_dict(): rank 0")]
    assert outside, reasons
    assert "loaded == saved, but step 4 (resumed step 1) differs" in outside[0], outside
    assert named in " ".join(outside), outside
    assert not any(r.startswith("did not round-trip") for r in reasons), reasons
    if fixture == "scheduler_outside_state":
        assert any("an LR scheduler whose state is not in state_dict()" in r for r in outside)
    else:
        assert re.search(r"loss expected -?\d\S* \(0x[0-9a-f.]+p[+-]\d+\), got", outside[0])


def test_a_generator_restored_at_the_first_step_passes_with_a_restored_late_warning() -> None:
    """It resumes exactly, yet right after the load its state_dict() holds the fresh generator,
    as Hugging Face's Trainer, which restores its RNG inside its loop just before the first
    step: a checkpoint taken in between would not resume, which no such loop does. The resume
    and the torchrun restart both pass it with the same warning, not a lost key."""
    names = ["resume_1", "elastic_restart_2_to_2"]
    reasons, observations = fixture_runs.run("fixture_loops:restores_rng_late", names)
    assert reasons == {name: [] for name in names}
    the_plan = plan.fixture_plan("fixture_loops:restores_rng_late", (1, 2))
    (resumed,) = rules.judge("resume_1", observations["resume_1"], run_plan=the_plan)[1]
    assert resumed == (
        "restored late: rank 0: right after load_state_dict(), state_dict() differs from what "
        "was saved in app.rng, yet every resumed step matches: the loaded state is applied "
        "later (at the first step); a checkpoint taken between the load and that step would "
        "save the fresh state and not resume, so apply it in load_state_dict() itself if the "
        "loop can save there"
    )
    restarted = rules.judge(names[1], observations[names[1]], run_plan=the_plan)[1]
    assert [c.split(": ")[:2] for c in restarted] == [
        ["restored late", f"restarted rank {r}"] for r in (0, 1)
    ], restarted
    assert all("differs from what was saved in rng, yet" in c for c in restarted), restarted


def test_a_save_that_steps_an_idle_optimizer_is_named_the_save_changed_training() -> None:
    """get_state_dict steps the head's optimizer, which has not stepped yet, as the save reads
    it: every run that saves trains the head otherwise than a run that never saves, and the
    resume from that save is exact. Only the arm that never saves shows it; the reason names
    the optimizer state the save made, and the mechanism."""
    (reason,) = derive("idle_optimizer_saved", ["resume_1"], (1,))["resume_1"]
    assert reason.startswith(
        "the save changed training: rank 0: a run that never saves and one that saved after "
        "step 3 part at step 6 (loss "
    ), reason
    assert (
        "right after the save the app's app.head_optimizer.state.0.exp_avg (new after the "
        "save: float32[1,16])" in reason
    ), reason
    assert "_init_optim_state in torch/distributed/checkpoint/state_dict.py" in reason, reason


def test_an_ema_teacher_left_out_is_named_with_its_fix() -> None:
    """The teacher distilled from is rebuilt from the loaded student: the first resumed loss
    differs, and the reason names the teacher's attributes and the fix before the generic
    advice."""
    (reason,) = derive("teacher_not_saved", ["resume_1"], (1,))["resume_1"]
    assert reason.startswith(
        "state outside state_dict(): rank 0: loaded == saved, but step 4 (resumed step 1) differs"
    ), reason
    assert (
        "the app's objects that differ right after the load: app.teacher.module.0.bias "
        "(float32[16], differs)"
    ) in reason, reason
    fix = "likely an EMA or averaged model is not saved: save its state_dict() beside the model's"
    assert fix in reason and reason.index(fix) < reason.index("check what steers the next step")


def test_an_ema_no_loss_shows_is_caught_at_the_end() -> None:
    """Every resumed loss matches; after the K steps the EMA does not, and fails on its own."""
    (reason,) = derive("ema_not_saved", ["resume_1"], (1,))["resume_1"]
    assert reason.startswith(
        "state outside state_dict(): rank 0: every resumed step matches, yet after the 3 resumed "
        "steps the app's app.ema.module.0.bias (float32[16], differs)"
    ), reason
    assert reason.endswith(
        "an EMA or averaged model is not saved: save its state_dict() beside the model's; if it "
        "is rebuilt on demand or only measured (a cache, a metric), leave it out with "
        "--ignore-attr app.ema"
    ), reason


@pytest.mark.parametrize(
    ("fixture", "name"), [("compiled", "resume_1"), ("frozen_first_layer", "resume_2")]
)
def test_correct_near_misses_pass(fixture: str, name: str) -> None:
    """No false alarm where the object walk meets what it might misread: a model under
    torch.compile (dynamo's wrapper and its caches), frozen parameters that never get
    gradients or optimizer state."""
    world_size = int(name.rsplit("_", 1)[1])
    assert derive(fixture, [name], (world_size,)) == {name: []}


def test_a_sampler_epoch_left_out_of_state_dict_is_named_by_its_attribute() -> None:
    """The step after the next reshuffle differs; the reason names the attribute, with the
    values it held at the save and after the load, and the fix, before the generic advice."""
    (reason,) = derive("epoch_not_saved", ["resume_1"], (1,))["resume_1"]
    assert reason.startswith(
        "state outside state_dict(): rank 0: loaded == saved, but step 5 (resumed step 2) differs"
    ), reason
    assert (
        "the app's objects that differ right after the load: app.sampler.epoch (saved int 2, "
        "loaded int 0) (likely a sampler's or loader's epoch is not restored: save it, and call "
        "sampler.set_epoch(epoch) after the load)"
    ) in reason, reason
    assert reason.index("app.sampler.epoch") < reason.index("check what steers the next step")


def test_a_scaler_no_loss_shows_is_caught_at_the_end_and_an_ignored_ema_is_not() -> None:
    """Every loss resumes exactly; the app's tensors after the K steps do not: the GradScaler's
    are named. Its EMA, declared irrelevant (--ignore-attr app.ema), is neither named nor in
    the evidence. (An EMA's own reason: tests/evidence/test_object_causes.py.)"""
    reasons, observed = fixture_runs.run(
        "fixture_loops:averages_unsaved", ["resume_1"], (1,), ignored_attrs=("app.ema",)
    )
    (reason,) = reasons["resume_1"]
    assert reason.startswith(
        "state outside state_dict(): rank 0: every resumed step matches, yet after the 3 "
        "resumed steps the app's app.scaler._scale (float32[], differs) differ"
    ), reason
    assert "a loss scaler (GradScaler) is not saved" in reason, reason
    walks = observed["resume_1"]["target"]["ranks"][0]["objects"]
    assert walks["final"] and not any(p.startswith("app.ema") for w in walks.values() for p in w)


def test_reset_adam_step_counters_are_named_key_by_key() -> None:
    reasons = derive("adam_step_reset", ["resume_1"])["resume_1"]
    steps = [
        r
        for r in reasons
        if r.startswith("did not round-trip") and r.split(": ")[2].endswith(".step")
    ]
    assert steps, reasons
    assert all("loaded float32[] differs from saved (max abs diff 3.0)" in r for r in steps), steps


def test_a_narrowed_dtype_is_a_round_trip_failure_with_its_magnitude() -> None:
    reasons = derive("narrowed_dtype", ["resume_1"])["resume_1"]
    model = [
        r for r in reasons if r.startswith("did not round-trip through DCP: rank 0: app.model.")
    ]
    assert model, reasons
    assert all("max abs diff" in r for r in model), model


def test_a_per_rank_value_under_one_key_names_the_rank_whose_value_was_kept() -> None:
    results = derive("per_rank_value_one_key", ["resume_1", "resume_2"])
    assert results["resume_1"] == []  # one rank: nothing to lose
    reasons = results["resume_2"]
    assert any(
        r.startswith("did not round-trip through DCP: rank 1: ")
        and "it holds rank 0's saved value" in r
        for r in reasons
    ), reasons
    # Rank 0 loaded its own value; its step moved only because rank 1's did.
    assert not any(r.startswith("state outside state_dict()") for r in reasons), reasons


def test_a_non_deterministic_fixture_is_reported_as_such_not_as_a_resume_bug() -> None:
    reasons = derive("nondeterministic", ["resume_1"])["resume_1"]
    assert len(reasons) == 1, reasons
    assert reasons[0].startswith(
        "non-deterministic fixture: rank 0: two uninterrupted runs differ at step 1"
    ), reasons


def test_async_saves_hold_the_state_at_the_save_while_the_next_step_runs() -> None:
    the_plan = plan.fixture_plan("fixture_loops:correct", (2,))
    names = ["async_resume_2", "async_staged_resume_2", "async_process_resume_2"]
    suite = runner.run_suite(run_plan=the_plan, names=names)
    for name, obs in suite.observations.items():
        assert rules.derive(name, obs, run_plan=the_plan) == [], name
        for rank in obs["reference"]["ranks"]:
            # The overlap is certain, not a matter of timing: the write waited for the step.
            assert rank["async"]["pending_during_step"] is True
            assert rank["async"]["upload_error"] is None
        staged = [r["async"]["staged_first"] for r in obs["reference"]["ranks"]]
        assert staged == [name.startswith("async_staged")] * 2


def test_a_save_that_reads_the_tensors_late_is_caught_naming_the_keys() -> None:
    # The correct loop, with the tool's stager replaced in its workers by one that stages by
    # reference (tests/lazy_staging.py), so the write sees step N+1's tensors.
    reasons = derive("correct", ["async_resume_1"], module="lazy_staging")["async_resume_1"]
    during = [r for r in reasons if r.startswith("changed during the save: rank 0: ")]
    assert during, reasons
    assert "app.model.0.weight" in during[0] and "hold the state after step 4" in during[0]
    assert "app.rng" not in during[0]  # a generator's state is copied by get_state(): unaffected


def test_an_fsdp2_loop_reshards_both_ways_and_resumes_exactly() -> None:
    results = derive("fsdp2", ["resume_2", "reshard_1_to_2", "reshard_2_to_1"])
    assert results == {"resume_2": [], "reshard_1_to_2": [], "reshard_2_to_1": []}


def test_a_correct_loop_holds_at_world_sizes_one_two_and_four() -> None:
    the_plan = plan.fixture_plan("fixture_loops:correct", (1, 2, 4))
    # Every scenario at world size 4 (the others run at 1 and 2 throughout this module).
    names = [n for n in the_plan.names if "4" in n]
    assert len(names) == 1 + 4 + 2  # resume_4, four reshards, async and staged at 4
    results = derive("correct", names, (1, 2, 4))
    assert results == {n: [] for n in names}


# --- state that differs by rank: checked per rank, never required to agree -------------------


def test_dataloader_workers_in_torchruns_ranks_get_their_batches_under_a_long_tmpdir() -> None:
    # The session's TMPDIR (conftest.py) is deep, and a scenario's deeper still: a rank started
    # by torchrun as a fresh interpreter made multiprocessing's sockets there, too long to bind,
    # and waited for batches that never came until the timeout.
    assert len(tempfile.gettempdir()) > 30, "the test needs a deep TMPDIR"
    results = derive("loader_workers", ["resume_2", "elastic_restart_2_to_2"])
    assert results == {"resume_2": [], "elastic_restart_2_to_2": []}


def test_rank_keyed_state_resumes_per_rank_without_a_false_alarm() -> None:
    # Each rank's loader state is its own: the torchrun restart compares each rank with itself.
    results = derive("rank_keyed", ["resume_2", "elastic_restart_2_to_2"])
    assert results == {"resume_2": [], "elastic_restart_2_to_2": []}


def test_rank_keyed_state_that_cannot_reshard_is_named_both_ways() -> None:
    results = derive("rank_keyed", ["reshard_2_to_4", "reshard_4_to_2"], (2, 4))
    # Growing: ranks 2 and 3 ask for keys nobody saved; DCP refuses, and the cause is named.
    grow = results["reshard_2_to_4"]
    assert grow and all(r.startswith("does not reshard: ") for r in grow), grow
    assert any(
        "rank 2 at world size 4: the checkpoint saved at world size 2 has no app.loader.rank_2."
        in r
        and "--rank-local loader" in r
        for r in grow
    ), grow
    # Shrinking: the load succeeds and silently drops ranks 2 and 3's positions (torchtitan
    # issue #811): every key no rank loaded is named.
    (shrink,) = results["reshard_4_to_2"]
    assert shrink.startswith("saved state not loaded: saved at world size 4, loaded by no rank"), (
        shrink
    )
    for key in ("app.loader.rank_2.order", "app.loader.rank_3.position"):
        assert key in shrink, shrink
    assert "app.loader.rank_1" not in shrink, shrink


def test_rank_keyed_state_declared_rank_local_passes_at_one_two_and_four() -> None:
    the_plan = plan.fixture_plan("fixture_loops:rank_keyed", (1, 2, 4), rank_local=("loader",))
    results = derive("rank_keyed", list(the_plan.names), (1, 2, 4), rank_local=("loader",))
    assert results == {n: [] for n in the_plan.names}


def test_fixture_arguments_reach_the_fixture_and_the_plan(tmp_path: Path) -> None:
    proc = run_fixture("fixture_loops:needs_width", tmp_path / "out", "--fixture-arg", "width=16")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    provenance = canonical.loads((tmp_path / "out" / schema.PROVENANCE_FILE).read_bytes())
    assert provenance["plan"]["fixture_args"] == {"width": 16}
    assert verify_artifact(tmp_path / "out").passed

    proc = run_fixture("fixture_loops:needs_width", tmp_path / "bad", "--fixture-arg", "height=1")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "cannot be called as needs_width(rank, world_size, height=...)" in line, line
    assert not (tmp_path / "bad").exists()


# --- an app that saves itself: its own save() and load(), never DCP ---------------------------


def test_an_app_that_saves_itself_holds_at_each_world_size_and_across_the_restart(
    tmp_path: Path,
) -> None:
    """Its files are committed as it wrote them (no .metadata), its load() reads them back in
    fresh processes and in torchrun's restarted ranks, and the plan records who saved."""
    out = tmp_path / "out"
    proc = run_fixture("saving_loops:saves_itself", out, "--world-sizes", "1,2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = ["resume_1", "resume_2", "elastic_restart_2_to_2", "half_written_2"]
    for name in names:
        assert re.search(rf"^pass\s+{name}\s", proc.stdout, re.M), proc.stdout
    notes = [line for line in proc.stdout.splitlines() if line.startswith("note: ")]
    assert notes == [
        "note: saving_loops:saves_itself's app has its own save() and load(): the tool ran them "
        "instead of DCP, at each world size and across torchrun's restart; no reshard checked: "
        "set reshards = True on the app if its load() restores a save made at another world "
        "size; no async save checked: set saves_async = True on the app if its save() returns "
        "a future that completes with the write"
    ], proc.stdout
    provenance = canonical.loads((out / schema.PROVENANCE_FILE).read_bytes())
    assert provenance["plan"]["checkpointing"] == "app"
    assert provenance["plan"]["scenarios"] == names
    observed = canonical.loads((out / schema.observation_file("resume_2")).read_bytes())
    assert [f["path"] for f in observed["commit"]["files"]] == ["rank0.pt", "rank1.pt"]
    assert verify_artifact(out).passed
    verified = run_cli("verify", str(out))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert [line for line in verified.stdout.splitlines() if line.startswith("note: ")] == notes


def test_a_scheduler_the_apps_own_load_drops_is_named_by_key() -> None:
    """Lightning Fabric 2.6.6's ModelParallelStrategy load, in miniature: the scheduler is saved
    and never restored. The cause is the app's save and load, not DCP."""
    reasons = derive("scheduler_not_restored", ["resume_1"], (1,), module="saving_loops")
    lost = [r for r in reasons["resume_1"] if r.startswith(APP_ROUND_TRIP + ": rank 0: app.sched.")]
    assert lost, reasons
    assert not any("DCP" in r for r in reasons["resume_1"]), reasons


def test_an_app_without_state_is_judged_by_its_losses_and_its_save_and_load_named() -> None:
    """No state_dict(): the correct app passes at two ranks, the one that drops its scheduler
    fails on the step its fresh scheduler changes, named as its load()'s, and a load() that
    raises is named by its exception."""
    assert derive("opaque", ["resume_2"], (2,), module="saving_loops") == {"resume_2": []}
    reasons = derive("opaque_scheduler_not_restored", ["resume_1"], (1,), module="saving_loops")
    (first, *_) = reasons["resume_1"]
    assert first.startswith(
        "not restored by the app's save() and load(): rank 0: after the app's load(), step 6 (resumed "
        "step 3) differs: loss expected"
    ), reasons
    assert "the app has no state_dict()" in first, first
    reasons = derive("loads_the_wrong_file", ["resume_1"], (1,), module="saving_loops")
    assert reasons["resume_1"] == [
        f"{APP_ROUND_TRIP}: resumed rank 0: the app's own load() raised FileNotFoundError on "
        "the checkpoint its save() wrote; its traceback is in the worker's log"
    ], reasons
    reasons = derive("nests_too_deep", ["resume_1"], (1,), module="saving_loops")
    assert reasons["resume_1"] == [
        "the app's save() cannot be sealed: commit: d0/d1/d2/d3/d4/d5/d6/d7/d8/d9/d10/d11/d12/"
        "d13/d14/d15/d16: a directory 17 levels deep; a checkpoint's directories may nest at "
        "most 16 levels",
        "target: did not run",  # nothing was promoted to load
    ], reasons


def test_what_an_app_declares_and_keeps_passes() -> None:
    """Rank 0's one file, written in the background, is read at 1 and at 2 ranks: what each
    rank loaded is what was saved, and the async save holds step N."""
    names = ["reshard_1_to_2", "reshard_2_to_1", "async_resume_2"]
    reasons = derive("reshards_and_saves_async", names, module="saving_loops")
    assert reasons == {name: [] for name in names}, reasons


def test_an_app_that_declares_it_reshards_and_does_not_is_named() -> None:
    """Declared and broken: the new rank finds no file of its own."""
    reasons = derive("reshards_per_rank", ["reshard_1_to_2"], module="saving_loops")
    assert (
        "does not reshard: rank 1 at world size 2: the app's own load() raised "
        "FileNotFoundError on the checkpoint its save() wrote at world size 1, though the app "
        "declares reshards = True: make its load() take a save from another world size, or "
        "drop the declaration; its traceback is in the worker's log"
    ) in reasons["reshard_1_to_2"], reasons


def test_an_async_save_that_reads_the_state_late_is_named() -> None:
    """Its future is waited for after step N+1: one that reads the live tensors only when
    waited for holds step N+1's, named."""
    reasons = derive("writes_when_waited_for", ["async_resume_2"], (2,), module="saving_loops")
    during = [r for r in reasons["async_resume_2"] if r.startswith("changed during the save: ")]
    assert len(during) == 2 and "the app's save() returned before it had copied" in during[0]


def test_an_app_that_saves_a_tree_is_committed_loaded_and_cut_short_as_it_wrote_it() -> None:
    """Files in subdirectories and a directory left empty, as frameworks write them: sealed and
    promoted as a tree, loaded in fresh processes at one and two ranks (its load() refuses a
    checkpoint without the empty directory), and cut short by relative path. A load() that
    skips one subdirectory is named by the keys it leaves unrestored."""
    reasons, observations = fixture_runs.run(
        "saving_loops:saves_a_tree", ["resume_2", "half_written_2"], (2,)
    )
    assert reasons == {"resume_2": [], "half_written_2": []}, reasons
    files = [f["path"] for f in observations["resume_2"]["commit"]["files"]]
    assert files == ["model/rank0.pt", "model/rank1.pt", "optim/rank0.pt", "optim/rank1.pt"]
    assert observations["half_written_2"]["cut"] == {
        "kept": ["model/rank0.pt", "model/rank1.pt"],
        "truncated": "optim/rank0.pt",
        "left_out": ["optim/rank1.pt"],
    }
    reasons = derive("ignores_the_optimizer_directory", ["resume_1"], (1,), module="saving_loops")
    lost = [r for r in reasons["resume_1"] if r.startswith(f"{APP_ROUND_TRIP}: rank 0: app.optim")]
    assert lost, reasons


def test_a_rank_killed_inside_the_apps_save_leaves_nothing_to_load(tmp_path: Path) -> None:
    """Nothing of a save some rank never returned from is sealed: no generation, no pointer, so
    nothing reaches the app's load()."""
    import saving_loops

    out = tmp_path / "out"
    proc = run_fixture("saving_loops:dies_inside_save", out, "--world-sizes", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    observed = canonical.loads((out / schema.observation_file("resume_2")).read_bytes())
    assert observed["reference"]["exit_codes"][1] == saving_loops.DIES_INSIDE_SAVE
    assert observed["commit"] is None and observed["target"] is None
    assert verify_artifact(out).valid


def test_a_load_that_takes_a_checkpoint_cut_short_for_none_is_named() -> None:
    """A loop that starts afresh when its file cannot be read returns from load() on every rank
    of a save cut short (rank 1's file cut to half): after a crash mid-save it would train on
    from step 0."""
    reasons = derive("starts_afresh_on_a_bad_file", ["half_written_2"], (2,), module="saving_loops")
    assert reasons["half_written_2"] == [
        "the app's load() takes a checkpoint cut short: every rank's load() returned on the save "
        "after 3 steps cut short (rank0.pt whole, rank1.pt cut to half): a job resumed after a "
        "crash mid-save would train on what it read; have load() check that every file is whole "
        "(a manifest written last, as DCP's .metadata is) or resume only from what the save "
        "marked finished"
    ], reasons


# --- what the user did wrong: bad input exits 2 before any scenario ---------------------------


def _refused_as_bad_input(proc: subprocess.CompletedProcess[str], out: Path) -> str:
    """The one line a run refused as bad input says: exit 2, no traceback, nothing written."""
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dcp-invariant: error: "), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not out.exists()
    return lines[0]


# Once for each place bad input is found: the fixture's module, imported before any scenario,
# and its app, probed in a worker. Each kind of problem is named in the tests of what finds it:
# tests/suite/test_fixture.py (the module and the callable), tests/ranks/test_fixture_tasks.py
# (the probe) and tests/ranks/test_state_keys.py (what DCP cannot save).
@pytest.mark.parametrize(
    ("fixture", "message"),
    [
        ("no_such_module:fixture", "cannot import 'no_such_module'"),
        (
            "fixture_loops:sparse_state",
            "state_dict() holds app.extra.value, a sparse tensor (layout torch.sparse_coo, "
            "device cpu), which DCP cannot save",
        ),
    ],
)
def test_a_fixture_outside_the_interface_is_one_line_and_exit_2(
    tmp_path: Path, fixture: str, message: str
) -> None:
    out = tmp_path / "out"
    proc = run_cli("run", "--fixture", fixture, "--output-dir", str(out), cwd=TESTS)
    line = _refused_as_bad_input(proc, out)
    assert message in line, line


def test_a_fixture_module_that_cannot_be_imported_is_one_line_and_exit_2(tmp_path: Path) -> None:
    # The other ways an import fails are in tests/suite/test_fixture.py.
    source = "import torch\n\ndef fixture(rank, world_size)\n    return None\n"
    (tmp_path / "broken_fixture.py").write_text(source)
    out = tmp_path / "out"
    proc = run_fixture("broken_fixture:fixture", out, cwd=tmp_path)
    line = _refused_as_bad_input(proc, out)
    where = f"{(tmp_path / 'broken_fixture.py').resolve()}:3: "
    assert f"importing 'broken_fixture' failed: {where}SyntaxError: expected ':'" in line, line


def test_a_non_finite_loss_after_the_probe_is_a_classified_failure(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_fixture("fixture_loops:nan_at_step_5", out)
    assert proc.returncode == 1, proc.stderr
    for name in ("resume_1", "async_resume_1", "async_staged_resume_1", "async_process_resume_1"):
        reasons = canonical.loads((out / schema.result_file(name)).read_bytes())["reasons"]
        assert reasons[0].startswith(
            "non-finite loss: uninterrupted run (reference) rank 0: step 5 returned nan, so "
        ), (name, reasons)
        assert not any("exited with code" in r for r in reasons), reasons
    # The rank's log says it in one line; no traceback, least of all of the tool's frames.
    assert "fixture: step 5 returned nan, expected a finite float loss" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"dcp_invariant{os.sep}" not in proc.stderr, proc.stderr
    report = verify_artifact(out)  # the verifier derives the same reasons from observations
    assert report.valid and not report.passed, report.problems


def test_a_non_finite_loss_in_a_reshards_source_stops_it_there() -> None:
    """The source is resume_1's reference arm, N steps, the save and K more: it meets the NaN
    at step 5 and the reshard is judged no further. (A NaN in the resharded steps themselves:
    tests/evidence/test_reshard_rules.py.)"""
    reasons = derive("nan_at_step_5", ["reshard_1_to_2"])["reshard_1_to_2"]
    assert reasons == [
        "non-finite loss: source rank 0: step 5 returned nan, so nothing after it can be "
        "compared; find what overflows or divides by zero (the learning rate, the data, a loss "
        "scale), or check fewer steps (--steps-before, --steps-after)"
    ]


def test_quantized_and_strided_views_resume_exactly_and_a_lost_scale_is_caught() -> None:
    assert derive("quantized_state", ["resume_1"]) == {"resume_1": []}
    reasons = derive("quantized_scale_changes", ["resume_1"])["resume_1"]
    # DCP saves the integers and loads them into the fresh app's tensor, at its own scale.
    assert reasons[0].startswith("did not round-trip through DCP: rank 0: app.extra.value"), reasons


def test_a_fixture_that_raises_fails_showing_its_own_frames(tmp_path: Path) -> None:
    proc = run_fixture("fixture_loops:raises_in_step", tmp_path / "out")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # The reasons on stdout; the logs on stderr, the fixture's traceback first, and shown once
    # however many scenarios fail on it.
    assert (
        "the app's step() raised: uninterrupted run (reference) rank 0: ValueError; its "
        "traceback is in the worker's log"
    ) in proc.stdout
    assert "Traceback" not in proc.stdout
    logs = proc.stderr.splitlines()
    assert logs[0].strip().startswith("traceback, the fixture's frames"), proc.stderr
    assert "fixture_loops.py" in logs[1], proc.stderr
    assert logs.count("      ValueError: boom from the fixture") == 1, proc.stderr
    assert len(re.findall(r"^fail ", proc.stdout, re.M)) == 4, proc.stdout
    assert f"dcp_invariant{os.sep}suite" not in proc.stderr, proc.stderr
    assert verify_artifact(tmp_path / "out").valid


def test_a_fixture_that_hangs_fails_with_a_timeout_and_leaves_no_process(tmp_path: Path) -> None:
    proc = run_fixture("fixture_loops:hangs", tmp_path / "out", "--timeout", "10")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        "timeout: uninterrupted run (reference): timed out and was killed; if the loop is that "
        "slow, raise --timeout SECONDS" in proc.stdout
    ), proc.stdout
    summary = canonical.loads((tmp_path / "out" / schema.SUMMARY_FILE).read_bytes())
    assert (summary["passed"], summary["failed"]) == (0, 4)  # resume_1 and the async resumes


@SHARES_EXAMPLE_RUN
def test_checked_in_fixture_artifact_still_matches_a_fresh_run(
    example_run: ExampleRun,
) -> None:
    """tests/data/fixture-artifact feeds the torch-free tests; it must stay what a run writes.

    It was recorded on another machine, whose CPU may give other last bits to float results:
    the observations are compared as no CPU can change them (tests/cross_machine.py), the rest
    exactly. That a run's bytes repeat on one machine is tested above (check() and the CLI
    write identical artifacts).
    """
    out, proc = example_run
    assert proc.returncode == 0, proc.stderr
    kept_dir = TESTS / "data" / "fixture-artifact"
    fresh = canonical.loads((out / schema.PROVENANCE_FILE).read_bytes())
    kept = canonical.loads((kept_dir / schema.PROVENANCE_FILE).read_bytes())
    same = ("torch_runtime", "cpython", "numpy", "os", "machine")
    if any(fresh[k] != kept[k] for k in same):
        pytest.skip("the checked-in fixture artifact was recorded with other versions")
    names = plan.fixture_plan("examples.mlp_fixture:fixture").names
    observations = {schema.observation_file(n) for n in names}
    # Not the manifest: the observations' SHA-256s, which are compared file by file.
    compared = [rel for rel in schema.artifact_files(names) if rel != schema.MANIFEST_FILE]
    assert cross_machine.differing_files(out, kept_dir, compared, observations) == []


# --- the README's buggy example, as it prints ---------------------------------------------------

README = REPOSITORY / "README.md"
BUGGY_COMMAND = (
    "dcp-invariant run --fixture examples.buggy_mlp_fixture:fixture --world-sizes 1 "
    "--output-dir out-buggy"
)
REGENERATE_ENV = "DCPI_REGENERATE_README"
# The torch release that printed the README's block: its losses and differences are floats, and
# another release may compute them otherwise. Another CPU, with the same release, computes them
# with other kernels (torch picks them by instruction set, aten/src/ATen/native/DispatchStub.cpp,
# and its BLAS by CPU model): measured with ATEN_CPU_CAPABILITY=default against AVX2 and AVX512,
# they moved by up to 3e-8 relative after four steps. So floats are compared to a relative 1e-6.
README_RECORDED = TESTS / "data" / "readme-buggy-example.recorded"
FLOAT_REL_TOL = 1e-6


def test_the_readme_shows_what_the_buggy_example_prints(tmp_path: Path) -> None:
    """The README's command, run as written into an output directory of its own, prints the
    README's block; ``DCPI_REGENERATE_README=1`` rewrites the block instead."""
    if not README.is_file() or not (REPOSITORY / "examples").is_dir():
        pytest.skip("README.md and examples/ are not here (outside the source tree)")
    text = README.read_text(encoding="utf-8")
    command_block = f"```\n{BUGGY_COMMAND}\n```\n"
    assert command_block in text, "the README no longer shows the buggy example's command"
    block = re.compile(r"^```\n(.*?)^```$", re.M | re.S).search(
        text, text.index(command_block) + len(command_block)
    )
    assert block is not None, "no output block after the buggy example's command"
    *command, flag, directory = shlex.split(BUGGY_COMMAND)
    assert (command[0], flag) == ("dcp-invariant", "--output-dir")
    out = tmp_path / directory
    # The revision is read from the environment, so the command stays the README's.
    proc = run_cli(
        *command[1:], flag, str(out), cwd=REPOSITORY, env={**os.environ, "GITHUB_SHA": REVISION}
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    printed = proc.stdout.replace(str(out), directory)
    here = _torch_version()
    if os.environ.get(REGENERATE_ENV) == "1":
        README.write_text(text[: block.start(1)] + printed + text[block.end(1) :], "utf-8")
        README_RECORDED.write_text(here + "\n", encoding="utf-8")
        return
    recorded = README_RECORDED.read_text(encoding="utf-8").strip()
    if here != recorded:
        pytest.skip(
            f"the README's output was printed by torch {recorded}, this is {here}: its floats "
            f"may differ ({REGENERATE_ENV}=1 rewrites it)"
        )
    run_words, run_floats = as_compared(printed)
    readme_words, readme_floats = as_compared(block[1])
    assert run_words == readme_words, (
        f"the README's output differs from a run; {REGENERATE_ENV}=1 rewrites it"
    )
    far = [
        (r, w)
        for r, w in zip(run_floats, readme_floats, strict=True)
        if not math.isclose(r, w, rel_tol=FLOAT_REL_TOL)
    ]
    assert not far, f"the README's numbers differ from a run's (run, README): {far[:5]}"


# A float as the console prints it: float.hex, or repr's decimal form.
_PRINTED_FLOAT = re.compile(
    r"-?0x[0-9a-f]+(?:\.[0-9a-f]*)?p[-+]?\d+|-?\d+\.\d+(?:e[-+]?\d+)?|-?\d+e[-+]?\d+"
)


def as_compared(stdout: str) -> tuple[list[str], list[float]]:
    """What must match: each scenario's verdict and reasons, not its seconds, nor the order in
    which scenarios finished (two run at a time); then the final line. The words must be equal,
    and the floats, taken out in order, close."""
    text = re.sub(r"^(\w+  \w+) +\d+\.\d s$", r"\1 N s", stdout.strip(), flags=re.M)
    *scenarios, final = re.split(r"\n(?=\S)", text)
    lines = [*sorted(scenarios), final]
    floats = [
        float.fromhex(m[0]) if "0x" in m[0] else float(m[0])
        for line in lines
        for m in _PRINTED_FLOAT.finditer(line)
    ]
    return [_PRINTED_FLOAT.sub("<float>", line) for line in lines], floats


def test_printed_floats_are_compared_closely_and_words_exactly() -> None:
    printed = (
        "fail  resume_1   0.3 s\n      - loss expected 0.5 (0x1.0000000000000p-1), got 1e-05\n"
    )
    words, floats = as_compared(printed)
    assert words == ["fail  resume_1 N s\n      - loss expected <float> (<float>), got <float>"]
    assert floats == [0.5, 0.5, 1e-05]
    assert as_compared(printed.replace("loss", "lost"))[0] != words


def _torch_version() -> str:
    """The release of torch this Python runs, e.g. ``2.13.0+cpu``."""
    return subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.strip()
