"""Live tests with real code: training loops built on ``transformers`` and ``torchdata`` (the
``loops`` extra), run through the CLI as a user runs them, from ``tests/real_loops``.

Each loop is checked in its correct form, which must pass (exit 0: a false alarm is as bad as a
miss), and with planted bugs, each of which must fail (exit 1) for its cause: the reasons in the
artifact's results start with the cause class docs/diagnoses.md lists. The fast subset runs with
the other live tests; the rest is marked ``real_loops`` and runs only when ``-m`` names that
marker (CONTRIBUTING.md, "Run the tests").
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cli_runs import REVISION, run_cli

from dcp_invariant import canonical
from dcp_invariant.evidence import schema

# Where the extra is not installed (the integration job installs only pytest beside the action's
# torch), the module is skipped, saying so.
pytest.importorskip("transformers", reason="needs the loops extra: pip install -e '.[loops]'")
pytest.importorskip("torchdata", reason="needs the loops extra: pip install -e '.[loops]'")

pytestmark = pytest.mark.live

LOOPS = Path(__file__).resolve().parent.parent / "real_loops"
MARKER = "real_loops"
SLOW = pytest.mark.real_loops  # about 8 minutes together; see the skip below

# Results of one CLI run: the process, and each scenario's reasons (empty when it passed).
Run = tuple[subprocess.CompletedProcess[str], dict[str, list[str]]]


@pytest.fixture(autouse=True)
def _slow_runs_only_when_named(request: pytest.FixtureRequest) -> None:
    """A ``real_loops`` test runs only when the ``-m`` expression names the marker.

    ``pytest -m live`` (the integration job) keeps the fast subset; the slow runs would add
    several minutes to every CI run (their times are in CONTRIBUTING.md).
    """
    if request.node.get_closest_marker(MARKER) and MARKER not in request.config.option.markexpr:
        pytest.skip(f"slow real-code loop: runs with -m {MARKER}")


def run_loop(fixture: str, world_sizes: str, out: Path, *extra: str) -> Run:
    """``run --fixture`` from ``tests/real_loops``, and the reasons of every planned scenario."""
    proc = run_cli(
        "run",
        "--fixture",
        fixture,
        "--world-sizes",
        world_sizes,
        *extra,
        "--output-dir",
        str(out),
        "--source-revision",
        REVISION,
        cwd=LOOPS,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    names = canonical.loads((out / schema.PROVENANCE_FILE).read_bytes())["plan"]["scenarios"]
    results = {
        name: canonical.loads((out / schema.result_file(name)).read_bytes())["reasons"]
        for name in names
    }
    return proc, results


def assert_passes(run: Run) -> None:
    proc, results = run
    failed = {name: reasons for name, reasons in results.items() if reasons}
    assert not failed, (failed, proc.stdout + proc.stderr)  # the console holds the workers' logs
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- a data-parallel Llama fed by StatefulDataLoader ---------------------------------------------


@pytest.mark.parametrize(
    ("num_workers", "world_sizes"),
    [
        pytest.param(0, "1", id="no-workers-1"),
        pytest.param(0, "1,2", marks=SLOW, id="no-workers-1,2"),
        pytest.param(2, "1,2", marks=SLOW, id="2-workers-1,2"),
    ],
)
def test_a_llama_ddp_loop_with_a_stateful_dataloader_resumes_exactly(
    tmp_path: Path, num_workers: int, world_sizes: str
) -> None:
    # Three steps, then three resumed: the fourth ends an epoch, so the next one's shuffle (and,
    # with workers, their base seed) must come back from the saved state too.
    run = run_loop(
        "llama_ddp_loop:fixture",
        world_sizes,
        tmp_path / "out",
        "--fixture-arg",
        f"num_workers={num_workers}",
    )
    assert_passes(run)


@pytest.mark.parametrize(
    ("bug", "num_workers", "step", "named"),
    [
        # The data starts over: another batch at once, so the model moves first.
        # With the slow loops since the app's own objects are compared too (CI's time): the
        # fast subset keeps the correct loop, the guard against a false alarm on real code, and
        # small loops name this cause on every change (test_fixture_live.py).
        pytest.param(
            "loader_not_saved",
            0,
            "step 4 (resumed step 1)",
            "keys that differ first: app.model.",
            marks=SLOW,
            id="loader_not_saved",
        ),
        pytest.param(
            "scheduler_not_saved",
            0,
            "step 4 (resumed step 1)",
            "an LR scheduler whose state is not in state_dict()",
            marks=SLOW,
            id="scheduler_not_saved",
        ),
        # torchdata 0.11.0 replays the saved epoch but shuffles the next one differently.
        pytest.param(
            "loader_generator",
            0,
            "step 5 (resumed step 2)",
            "keys that differ first: app.data._sampler_iter_state.sampler_iter_state.generator",
            marks=SLOW,
            id="loader_generator",
        ),
        # With workers, the next epoch's base seed comes from the global RNG.
        pytest.param(
            "global_rng_not_saved",
            2,
            "step 5 (resumed step 2)",
            "keys that differ first: app.data._snapshot._main_snapshot._base_seed",
            marks=SLOW,
            id="global_rng_not_saved",
        ),
    ],
)
def test_a_llama_ddp_loop_with_state_outside_state_dict_fails_naming_the_cause(
    tmp_path: Path, bug: str, num_workers: int, step: str, named: str
) -> None:
    proc, results = run_loop(
        "llama_ddp_loop:fixture",
        "1",
        tmp_path / "out",
        "--fixture-arg",
        f'bug="{bug}"',
        "--fixture-arg",
        f"num_workers={num_workers}",
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert set(results) == {
        "resume_1",
        "async_resume_1",
        "async_staged_resume_1",
        "async_process_resume_1",
    }
    for name, reasons in results.items():
        # Everything loaded equals what was saved; what is missing was never in state_dict().
        assert reasons, name
        assert all(r.startswith("state outside state_dict(): rank 0: ") for r in reasons), reasons
        assert reasons[0].startswith(
            f"state outside state_dict(): rank 0: loaded == saved, but {step} differs"
        ), reasons
        assert named in " ".join(reasons), reasons


# --- an FSDP2 Llama with a StatefulDataLoader per rank, its state keyed by rank ----------------


# The same causes, named the same way, are proved on every change by a small loop
# (test_fixture_live.py, rank-keyed state that cannot reshard); this is the real FSDP2 loop's
# proof, 100 CPU-s, with the other slow loops.
@SLOW
def test_rank_keyed_loader_state_resumes_and_fails_only_to_reshard_undeclared(
    tmp_path: Path,
) -> None:
    proc, results = run_loop("llama_fsdp2_loop:fixture", "1,2", tmp_path / "out")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    # No false alarm where the world size stays: each rank loads its own key.
    reshards = {"reshard_1_to_2", "reshard_2_to_1"}
    assert {name: r for name, r in results.items() if name not in reshards} == {
        name: [] for name in results if name not in reshards
    }
    # Growing: rank 1 asks for a key rank 0 never saved; DCP refuses, and the cause is named.
    grow = results["reshard_1_to_2"]
    assert grow and all(
        r.startswith("does not reshard: rank 1 at world size 2: ") and "app.data.rank_1." in r
        for r in grow
    ), grow
    assert "--rank-local data" in grow[0], grow
    # Shrinking: rank 1's saved loader state is read by no rank.
    shrink = results["reshard_2_to_1"]
    assert len(shrink) == 1, shrink
    assert shrink[0].startswith(
        "saved state not loaded: saved at world size 2, loaded by no rank at 1: app.data.rank_1."
    ), shrink
    assert "app.data.rank_0." not in shrink[0] and "--rank-local data" in shrink[0], shrink


@SLOW
def test_an_fsdp2_loop_with_rank_local_loader_state_holds_at_one_two_and_four(
    tmp_path: Path,
) -> None:
    run = run_loop("llama_fsdp2_loop:fixture", "1,2,4", tmp_path / "out", "--rank-local", "data")
    assert_passes(run)
    assert len(run[1]) == 15, sorted(run[1])  # every resume, reshard, async and elastic scenario


@SLOW
def test_loader_state_under_one_key_is_a_round_trip_failure_naming_the_rank(
    tmp_path: Path,
) -> None:
    proc, results = run_loop(
        "llama_fsdp2_loop:fixture",
        "2",
        tmp_path / "out",
        "--rank-local",
        "data",
        "--fixture-arg",
        'bug="loader_not_rank_keyed"',
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert all(results.values()), results  # every scenario fails
    for name in ("resume_2", "async_resume_2", "async_staged_resume_2", "async_process_resume_2"):
        reasons = results[name]
        # DCP kept one rank's copy of the loader's state; the other rank loaded it.
        assert reasons[0].startswith("did not round-trip through DCP: rank "), reasons
        assert "app.data.dataset_state." in reasons[0], reasons
        assert "saved value: DCP keeps one copy of a value that is not a DTensor" in reasons[0]
        assert not any(r.startswith("state outside state_dict()") for r in reasons), reasons
    elastic = results["elastic_restart_2_to_2"]
    assert elastic[0].startswith("did not round-trip through DCP: restarted rank "), elastic
    assert "component 'data' differs" in elastic[0], elastic
