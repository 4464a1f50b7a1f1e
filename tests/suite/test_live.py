"""Live tests: real torch processes, real Gloo groups, real DCP, real torchrun.

The suite runs once per test session through the CLI (``live_artifact``); a second run checks
that observations are byte-identical. Negative tests run single scenarios in-process with a
broken fixture or a broken protocol and require the verdict to fail for the right reason.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import cross_machine
import pytest
from cli_runs import REVISION, run_cli

from dcp_invariant import canonical, dcp_layout, plan
from dcp_invariant.evidence import rules, schema
from dcp_invariant.evidence.verify import verify_artifact
from dcp_invariant.suite import pool, runner
from dcp_invariant.suite.torchrun import launch

pytestmark = pytest.mark.live
# The tests of the module's one run go to one pytest-xdist worker (--dist loadgroup), so that
# run is made once.
SHARES_LIVE_RUN = pytest.mark.xdist_group("live_run")


@pytest.fixture(scope="session")
def live_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    out = tmp_path_factory.mktemp("live") / "evidence"
    before = _temp_entries()
    proc = run_cli("run", "--output-dir", str(out), "--source-revision", REVISION)
    # Neither workers, the fork server nor torchrun may leave anything in the shared temp dir.
    assert _temp_entries() <= before, sorted(_temp_entries() - before)
    assert _children(os.getpid()) == []
    return out, proc


def _temp_entries() -> set[str]:
    """What is in this session's own temp directory (conftest.session_temp_dir), no one else's.

    pymp-*: multiprocessing's own per-interpreter directory, removed by its exit finalizer.
    """
    return {p for p in os.listdir(tempfile.gettempdir()) if not p.startswith("pymp-")}


@pytest.fixture(scope="session")
def live_artifact(live_run: tuple[Path, subprocess.CompletedProcess[str]]) -> Path:
    out, proc = live_run
    assert proc.returncode == 0, proc.stderr
    return out


@SHARES_LIVE_RUN
def test_all_eleven_scenarios_pass_and_report_progress(
    live_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, proc = live_run
    assert proc.returncode == 0, proc.stderr
    summary = canonical.loads((out / schema.SUMMARY_FILE).read_bytes())
    assert (summary["passed"], summary["failed"], summary["verdict"]) == (11, 0, "pass")
    for name in plan.SCENARIO_NAMES:
        assert re.search(rf"^pass\s+{name}\s+\d+\.\d s$", proc.stdout, re.M), proc.stdout
    assert proc.stdout.splitlines()[-1] == f"pass: 11 passed, 0 failed; evidence in {out}"
    assert sorted(
        str(p.relative_to(out).as_posix()) for p in out.rglob("*") if p.is_file()
    ) == list(schema.ARTIFACT_FILES)


@SHARES_LIVE_RUN
def test_live_artifact_verifies_offline(live_artifact: Path) -> None:
    proc = run_cli("verify", str(live_artifact))
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.splitlines()[-1] == "pass: 11 passed, 0 failed"
    if shutil.which("sha256sum"):
        check = subprocess.run(
            ["sha256sum", "-c", "manifest.sha256"],
            cwd=live_artifact,
            capture_output=True,
            timeout=60,
        )
        assert check.returncode == 0, check.stdout


@SHARES_LIVE_RUN
def test_a_second_run_gives_byte_identical_evidence(live_artifact: Path, tmp_path: Path) -> None:
    """Deterministic. Both runs take the platform's own start method: spawned workers on macOS
    and Windows, the fork server on Linux, where a spawned run (an interpreter importing torch
    per worker, about 40 CPU-s) is what the interrupt tests start already."""
    second = tmp_path / "second"
    before = _temp_entries()
    proc = run_cli("run", "--output-dir", str(second), "--source-revision", REVISION)
    assert proc.returncode == 0, proc.stderr
    assert _temp_entries() <= before, sorted(_temp_entries() - before)
    assert _children(os.getpid()) == []
    for rel in schema.ARTIFACT_FILES:
        assert (second / rel).read_bytes() == (live_artifact / rel).read_bytes(), rel


@pytest.mark.parametrize("start_method", pool.available_start_methods())
def test_a_worker_that_cannot_import_numpy_stops_the_run_before_any_scenario(
    tmp_path: Path, start_method: str
) -> None:
    shadow = tmp_path / "shadow" / "numpy"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'numpy'\")\n")
    search = [str(shadow.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(search),
        pool.START_METHOD_ENV: start_method,
    }
    out = tmp_path / "out"
    proc = run_cli("run", "--output-dir", str(out), "--source-revision", REVISION, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith(
        "dcp-invariant: error: a worker could not import numpy"
    ), proc.stderr
    assert proc.stdout == ""  # no scenario ran
    assert not out.exists()


@SHARES_LIVE_RUN
def test_evidence_names_no_path_host_user_or_process(live_artifact: Path) -> None:
    text = "\n".join(
        (live_artifact / rel).read_text(encoding="utf-8") for rel in schema.ARTIFACT_FILES
    )
    forbidden = [
        str(live_artifact.parent),
        tempfile.gettempdir(),
        str(Path.home()),
        "dcp-invariant-",
    ]
    forbidden += [w for w in (socket.gethostname(), getpass.getuser()) if len(w) >= 3]
    for word in forbidden:
        assert not re.search(rf"(?<![0-9A-Za-z]){re.escape(word)}(?![0-9A-Za-z])", text), word
    assert "pid" not in text.lower()
    assert not re.search(r'"(port|host|time|duration|seconds)"', text)


@SHARES_LIVE_RUN
def test_elastic_restart_is_observed_as_torchrun_reported_it(live_artifact: Path) -> None:
    obs = canonical.loads(
        (live_artifact / schema.observation_file("elastic_restart_2_to_2")).read_bytes()
    )
    assert obs["failure_marker"] == {"attempt": 0, "exit_code": 91, "rank": 1}
    assert [r["restart_count"] for r in obs["target"]["ranks"]] == [1, 1]
    guard = obs["launcher"]["guard"]
    assert guard["use_libuv"] is False and guard["stores_built"] >= 1
    assert obs["after"]["pointer"] == obs["commit"]["pointer_after"]


# --- negative live tests: each verdict family can fail, for the right reason -------------------


@pytest.fixture
def no_leftovers() -> Iterator[None]:
    """Fails a test that leaves a child process or a workspace behind."""
    before = _temp_entries()
    yield
    after = _temp_entries()
    assert after <= before, f"left in the temp dir: {sorted(after - before)}"
    assert _children(os.getpid()) == [], "child processes left behind"


def _children(pid: int) -> list[int]:
    if not Path("/proc").is_dir():
        return []
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            match = re.search(r"^PPid:\s+(\d+)$", status, re.M)
            if match and int(match.group(1)) == pid:
                out.append(int(entry.name))
    return out


def _run(names: list[str], fixture: str | None = None) -> dict[str, list[str]]:
    suite = runner.run_suite(run_plan=plan.REGISTERED, names=names, fixture=fixture)
    return {
        name: rules.derive(name, obs, run_plan=plan.REGISTERED)
        for name, obs in suite.observations.items()
    }


@pytest.mark.parametrize(
    ("fixture", "component"),
    [
        ("fixture_variants:rng_not_restored", "rng"),
        ("fixture_variants:cursor_not_restored", "cursor"),
        ("fixture_variants:naive_optimizer_state", "optimizer"),
    ],
)
def test_a_resume_bug_fails_the_training_verdict_naming_its_component(
    no_leftovers: None, fixture: str, component: str
) -> None:
    reasons = _run(["training_1_to_2"], fixture)["training_1_to_2"]
    after_load = [r for r in reasons if "after load" in r]
    assert after_load, reasons
    assert all(f"component '{component}'" in r for r in after_load), reasons
    assert any("resumed step" in r or "after the resumed step" in r for r in reasons), reasons


def test_a_resume_bug_fails_the_elastic_verdict_too(no_leftovers: None) -> None:
    reasons = _run(["elastic_restart_2_to_2"], "fixture_variants:rng_not_restored")[
        "elastic_restart_2_to_2"
    ]
    assert any("restarted rank" in r and "component 'rng'" in r for r in reasons), reasons


def test_promotion_without_verification_fails_the_damage_verdicts(
    no_leftovers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A protocol that trusts its receipt without re-reading the files: what the rules must catch.
    monkeypatch.setattr("dcp_invariant.commit.receipt.check", lambda directory, receipt: [])
    names = ["missing_metadata", "missing_shard", "corrupt_shard"]
    for name, reasons in _run(names).items():
        assert any("was promoted" in r for r in reasons), (name, reasons)
        assert any("the pointer moved" in r for r in reasons), (name, reasons)


def test_sealing_an_unfinished_save_fails_the_rank_exit_verdict(
    no_leftovers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the .metadata requirement, a crashed writer's candidate would be sealed.
    from dcp_invariant.commit import receipt

    real_seal = receipt.seal

    def seal_anything(directory: Path, label: str, marker: str | None) -> receipt.Receipt:
        (directory / dcp_layout.METADATA_FILE).write_bytes(b"")
        return real_seal(directory, label, marker)

    monkeypatch.setattr("dcp_invariant.commit.store.receipt.seal", seal_anything)
    reasons = _run(["rank_exit_no_promotion"])["rank_exit_no_promotion"]
    assert any("crashed writer's candidate was sealed" in r for r in reasons), reasons
    assert any("was promoted" in r for r in reasons), reasons


# --- the torchrun compatibility guard ----------------------------------------------------------

GUARDED_LAUNCH = """
import dataclasses, sys
import dcp_invariant.runtimes as runtimes
{patch}
from dcp_invariant.suite.torchrun.launch import main
sys.exit(main(["--standalone", "--local-addr=127.0.0.1", "--nnodes=1", "--nproc-per-node=1",
               "--max-restarts=0", "--module", "touch_worker"]))
"""


def _guarded(
    tmp_path: Path, patch: str, standby: str | None = None, ranks_path: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The guarded launcher; ``standby``: started ahead of need, given this on its input, and
    ``ranks_path``: the import path it gives its ranks at go."""
    (tmp_path / "touch_worker.py").write_text("open('worker-ran', 'w').close()\n")
    # torchrun writes its log directory under TMPDIR: keep it inside the test's own directory.
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tmp_path), *sys.path]),
        TMPDIR=str(tmp_path),
        TMP=str(tmp_path),
        TEMP=str(tmp_path),
    )
    if standby is not None:
        env[launch.STANDBY_ENV] = "1"
    if ranks_path is not None:
        env[launch.RANKS_PATH_ENV] = str(ranks_path)
    return subprocess.run(
        [sys.executable, "-c", GUARDED_LAUNCH.format(patch=patch)],
        cwd=tmp_path,
        env=env,
        input=standby,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        (
            "runtimes.RUNTIMES = tuple(dataclasses.replace(r, create_tcp_store_sha256='0' * 64)"
            " for r in runtimes.RUNTIMES)",
            "the guard does not know this code",
        ),
        ("runtimes.RUNTIMES = ()", "is not a registered runtime"),
        (
            "from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as b\n"
            "b.TCPStore = type('Impostor', (), {})",
            "something patched it first",
        ),
    ],
    ids=["wrong-digest", "unregistered-runtime", "patched-tcpstore"],
)
# On standby, told to stop: the guard refuses before the agent waits, so its exit says so.
@pytest.mark.parametrize("standby", [None, ""], ids=["launched", "standby"])
def test_guard_refusal_stops_torchrun_before_any_worker(
    tmp_path: Path, patch: str, message: str, standby: str | None
) -> None:
    proc = _guarded(tmp_path, patch, standby)
    assert proc.returncode == 3, proc.stderr
    assert "torchrun guard refused to start" in proc.stderr and message in proc.stderr
    assert not (tmp_path / "worker-ran").exists()


@pytest.mark.parametrize("standby", [None, "go\n"], ids=["launched", "standby"])
def test_guarded_launch_runs_torchrun_when_the_runtime_is_registered(
    tmp_path: Path, standby: str | None
) -> None:
    proc = _guarded(tmp_path, "", standby)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "worker-ran").exists()


@pytest.mark.parametrize("said", ["", "stop\n"], ids=["end-of-input", "other-line"])
def test_an_agent_on_standby_starts_nothing_until_it_is_told_go(tmp_path: Path, said: str) -> None:
    """The runner starts the restart's agent ahead of need: until its scenario says go, it has
    imported torch's launcher and nothing else ran; told anything else, it exits 0."""
    proc = _guarded(tmp_path, "", said)
    assert proc.returncode == 0, proc.stderr
    assert not (tmp_path / "worker-ran").exists()


def test_an_agent_on_standby_gives_its_ranks_the_users_path_and_keeps_it_off_its_own(
    tmp_path: Path,
) -> None:
    """A sitecustomize.py on the user's path (the fixture's directory) runs in no agent before
    go; the ranks, started after go, still find the user's modules there."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("open('sitecustomize-ran', 'w').close()\n")
    for said, ranks in (("", False), ("go\n", True)):
        proc = _guarded(tmp_path, "", said, ranks_path=user)
        assert proc.returncode == 0, proc.stderr
        assert (tmp_path / "worker-ran").exists() is ranks
        # The ranks' interpreters ran it, the agent's never did: only after go is it there.
        assert (tmp_path / "sitecustomize-ran").exists() is ranks


def test_guarded_store_serves_only_create_tcp_store() -> None:
    code = (
        "from dcp_invariant.suite.torchrun import guard\n"
        "from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as b\n"
        "guard.install()\n"
        "try:\n"
        "    b.TCPStore('127.0.0.1', 0, is_master=True)\n"
        "except guard.GuardError as exc:\n"
        "    print('refused:', exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "refused: the guarded TCPStore was called from <module>" in proc.stdout


@SHARES_LIVE_RUN
def test_checked_in_artifact_still_matches_a_fresh_run(
    live_artifact: Path, data_artifact: Path
) -> None:
    """tests/data/artifact feeds the torch-free tests; it must stay what the suite really writes."""
    fresh = canonical.loads((live_artifact / schema.PROVENANCE_FILE).read_bytes())
    kept = canonical.loads((data_artifact / schema.PROVENANCE_FILE).read_bytes())
    # DCP pickles its .metadata, so even file sizes may move with the Python or torch in use.
    if (fresh["torch_runtime"], fresh["cpython"], sys.platform) != (
        kept["torch_runtime"],
        kept["cpython"],
        "linux",
    ):
        pytest.skip(
            "the checked-in artifact was recorded with torch 2.13.0+cpu, CPython 3.11.7, Linux"
        )
    assert verify_artifact(data_artifact).passed
    # Provenance (and so the manifest) names the Python and NumPy in use; the rest must not move
    # but for what another CPU may compute otherwise (tests/cross_machine.py): the losses and
    # the digests of checkpoint bytes in the observations.
    observations = {schema.observation_file(n) for n in plan.SCENARIO_NAMES}
    compared = [
        rel
        for rel in schema.ARTIFACT_FILES
        if rel not in (schema.PROVENANCE_FILE, schema.MANIFEST_FILE)
    ]
    assert cross_machine.differing_files(live_artifact, data_artifact, compared, observations) == []
