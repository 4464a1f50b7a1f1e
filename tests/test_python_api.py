"""The Python API without torch: what check() refuses before anything runs, how a report ranks
and words its diagnoses. tests/suite/test_python_api_live.py runs it for real."""

from __future__ import annotations

import functools
import itertools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

import dcp_invariant
from dcp_invariant import BadInput, Diagnosis, Report, ScenarioResult, errors, plan, python_api
from dcp_invariant.evidence import diagnosis

REVISION = "0123456789abcdef0123456789abcdef01234567"


def module_level(rank: int, world_size: int) -> None:
    """Stands in for a fixture: check() resolves its name, never calls it here."""


@functools.wraps(module_level)
def wrapped(rank: int, world_size: int) -> None:
    """A decorator's wrapper that claims module_level's name."""


def test_a_module_level_callable_is_named_for_the_workers() -> None:
    assert python_api.fixture_spec(module_level) == f"{__name__}:module_level"
    assert python_api.fixture_spec("pkg.mod:make_app") == "pkg.mod:make_app"


def _local() -> Callable[[int, int], None]:
    def inner(rank: int, world_size: int) -> None:
        pass

    return inner


@pytest.mark.parametrize(
    ("fixture", "says"),
    [
        (lambda rank, world_size: None, "lambda or defined inside a function"),
        (_local(), "lambda or defined inside a function"),
        (wrapped, "does not name the callable given"),
        (42, "neither 'module:callable' nor a callable"),
    ],
    ids=["lambda", "local", "decorated", "number"],
)
def test_a_fixture_workers_cannot_import_is_bad_input(fixture: Any, says: str) -> None:
    with pytest.raises(BadInput, match=says) as caught:
        python_api.fixture_spec(fixture)
    assert "\n" not in str(caught.value)


def test_a_fixture_of_the_running_script_is_bad_input(monkeypatch: pytest.MonkeyPatch) -> None:
    def in_main(rank: int, world_size: int) -> None:
        pass

    monkeypatch.setattr(in_main, "__module__", "__main__")
    monkeypatch.setattr(in_main, "__qualname__", "in_main")
    with pytest.raises(BadInput, match=r"__main__.*move it into a module"):
        python_api.fixture_spec(in_main)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"world_sizes": (1, 1)}, "distinct integers"),
        ({"world_sizes": "12"}, "give integers"),
        ({"steps_before": 0}, "steps before the save"),
        ({"timeout": 0}, "timeout must be a number of seconds"),
        ({"timeout": float("nan")}, "timeout must be a number of seconds"),
        ({"timeout": True}, "timeout must be a number of seconds"),
        ({"source_revision": "abc"}, "source_revision 'abc' is not a 40-character"),
        ({"fixture_args": {"1x": 2}}, "its name must be a Python identifier"),
        ({"fixture_args": {"rank": 2}}, "passes rank and world_size itself"),
    ],
)
def test_bad_input_raises_before_anything_is_written(
    tmp_path: Path, options: dict[str, Any], says: str
) -> None:
    output = tmp_path / "evidence"
    before = sorted(os.listdir(os.environ["TMPDIR"]))
    with pytest.raises(BadInput, match=says) as caught:
        dcp_invariant.check(
            module_level, output_dir=output, **{"source_revision": REVISION, **options}
        )
    assert "\n" not in str(caught.value)
    assert not output.exists()
    assert sorted(os.listdir(os.environ["TMPDIR"])) == before


ITERABLE_OF_INTS = "world_sizes must be an iterable of ints, e.g. (1, 2), got"
MADE_OF_INTS = "world_sizes must be made of ints, e.g. (1, 2), got"
SEQUENCE_OF_STR = "rank_local must be a str or a sequence of str (top-level keys of state_dict())"
MADE_OF_STR = "rank_local must be made of str (top-level keys of state_dict()), got"
INT_DIGITS = sys.get_int_max_str_digits()
PATH = "output_dir must be a str or os.PathLike path, or None, got"


@pytest.mark.parametrize(
    ("options", "says"),
    [
        pytest.param({"world_sizes": 5}, f"{ITERABLE_OF_INTS} int 5", id="world_sizes int"),
        pytest.param({"world_sizes": None}, f"{ITERABLE_OF_INTS} NoneType None", id="sizes None"),
        pytest.param({"world_sizes": [1, "2"]}, f"{MADE_OF_INTS} str '2'", id="sizes str"),
        pytest.param({"world_sizes": [1, 2.0]}, f"{MADE_OF_INTS} float 2.0", id="sizes float"),
        # Endless: read no further than one past the most the plan takes.
        pytest.param(
            {"world_sizes": itertools.count(1)},
            "world sizes [1, 2, 3, 4, 5, 6, 7, 8, 9]: give distinct integers from 1 to 8",
            id="sizes endless",
        ),
        pytest.param({"steps_before": "3"}, "steps_before must be an int, got str '3'", id="n"),
        pytest.param({"steps_after": 2.0}, "steps_after must be an int, got float 2.0", id="k"),
        pytest.param(
            {"steps_after": True}, "steps_after must be an int, got bool True", id="k bool"
        ),
        pytest.param({"output_dir": 123}, f"{PATH} int 123", id="output_dir int"),
        pytest.param({"output_dir": b"out"}, f"{PATH} bytes b'out'", id="output_dir bytes"),
        pytest.param(
            {"output_dir": "ev\0idence"},
            "output_dir 'ev\\x00idence' holds a NUL character, which no file name can",
            id="output_dir NUL",
        ),
        pytest.param(
            {"timeout": "60"}, "timeout must be a number of seconds or None, got str '60'", id="t"
        ),
        pytest.param(
            {"fixture_args": [("width", 64)]},
            "fixture_args must be a mapping of names to JSON values, or None, got list",
            id="fixture_args list",
        ),
        pytest.param(
            {"fixture_args": {"width": 10**5000}},
            "fixture argument width: the value must be JSON with integers of at most 20 digits",
            id="fixture_args 5000 digits",
        ),
        pytest.param(
            {"fixture_args": {"lr": 0.1}},
            "fixture argument lr: the value must be JSON without floats (0.1 is one)",
            id="fixture_args float",
        ),
        # Integers Python cannot even convert to text are described, not shown.
        pytest.param(
            {"world_sizes": [10**5000]},
            f"world sizes a list holding an integer of more than {INT_DIGITS} digits: give",
            id="sizes 5000 digits",
        ),
        pytest.param(
            {"steps_before": 10**5000},
            f"steps before the save: an integer of more than {INT_DIGITS} digits, expected",
            id="n 5000 digits",
        ),
        pytest.param(
            {"timeout": 10**5000},
            f"timeout must be a number of seconds from 0 to 86400, got an integer of more than "
            f"{INT_DIGITS} digits",
            id="timeout 5000 digits",
        ),
        pytest.param({"rank_local": 5}, f"{SEQUENCE_OF_STR}, got int 5", id="rank_local int"),
        pytest.param({"rank_local": ["data", 1]}, f"{MADE_OF_STR} int 1", id="rank_local list"),
        pytest.param(
            {"source_revision": 5},
            "source_revision must be a 40-character hex string or None, got int 5",
            id="source_revision int",
        ),
        pytest.param(
            {"resume_with_torch": [2.15]},
            "resume_with_torch must be made of str (registered releases such as 2.15.0), got",
            id="resume_with_torch float",
        ),
        pytest.param(
            {"resume_with_torch": "2.15"},
            "--resume-with-torch '2.15': not a registered release",
            id="resume_with_torch unregistered",
        ),
        pytest.param(
            {"resume_with_torch": "2.15.0", "cache_dir": 5},
            "cache_dir must be a str or os.PathLike path, or None, got int 5",
            id="cache_dir int",
        ),
        pytest.param(
            {"resume_with_torch": "2.15.0", "cache_dir": "a\0b"},
            "cache_dir 'a\\x00b' holds a NUL character",
            id="cache_dir NUL",
        ),
        pytest.param(
            {"cache_dir": "cache"},
            "cache_dir goes with resume_with_torch",
            id="cache_dir without resume_with_torch",
        ),
    ],
)
def test_an_argument_of_the_wrong_type_is_bad_input_naming_it(
    tmp_path: Path, options: dict[str, Any], says: str
) -> None:
    """Each was a TypeError or ValueError from deep inside (or, for the endless iterator, a
    hang); each is one line naming the argument and what it takes, before anything runs."""
    before = sorted(os.listdir(os.environ["TMPDIR"]))
    arguments = {"output_dir": tmp_path / "evidence", "source_revision": REVISION, **options}
    with pytest.raises(BadInput) as caught:
        dcp_invariant.check(module_level, **arguments)
    # The API's own error for an argument, or the plan's for a value outside its grammar.
    assert isinstance(caught.value, (errors.CheckInputError, errors.PlanError))
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []
    assert sorted(os.listdir(os.environ["TMPDIR"])) == before


def test_outside_a_checkout_the_revision_is_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """check() and the plugin run from an sdist or a container image without .git."""
    from dcp_invariant import python_api

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_SHA", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert python_api.source_revision_of(None) == "unknown"
    assert python_api.source_revision_of(REVISION) == REVISION
    monkeypatch.setenv("GITHUB_SHA", REVISION)
    assert python_api.source_revision_of(None) == REVISION


def test_a_wrong_type_is_named_before_git_is_asked_for_the_revision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside a checkout, with no revision given, the revision cannot be found; the wrong
    type is what the message names, as it is checked first."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GITHUB_SHA", raising=False)
    with pytest.raises(errors.CheckInputError, match=f"^{PATH} int 123$"):
        dcp_invariant.check(module_level, output_dir=123)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_non_empty_output_directory_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine", encoding="utf-8")
    with pytest.raises(BadInput, match="not an empty directory"):
        dcp_invariant.check(module_level, output_dir=tmp_path, source_revision=REVISION)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


def test_the_api_defaults_are_the_clis() -> None:
    import inspect

    defaults = {
        name: p.default
        for name, p in inspect.signature(dcp_invariant.check).parameters.items()
        if p.default is not inspect.Parameter.empty
    }
    assert defaults["world_sizes"] == (1, 2)
    assert (defaults["steps_before"], defaults["steps_after"]) == (3, 3)
    assert python_api.checked_timeout(None) == 180.0


def _result(name: str, *reasons: str) -> ScenarioResult:
    return ScenarioResult(name, "fail" if reasons else "pass", reasons)


def test_diagnoses_are_grouped_by_cause_and_ranked() -> None:
    results = [
        _result("resume_1", f"{diagnosis.OUTSIDE_STATE_DICT}: rank 0: step 4 differs"),
        _result("reshard_1_to_2", "error: the driver stopped on OSError"),
        _result(
            "resume_2",
            f"{diagnosis.OUTSIDE_STATE_DICT}: rank 1: step 4 differs",
            f"{diagnosis.ROUND_TRIP}: rank 1: app.x differs",
        ),
        _result("elastic_restart_2_to_2"),
    ]
    ranked = python_api.ranked(results)
    assert [d.cause for d in ranked] == [
        diagnosis.ROUND_TRIP,
        diagnosis.OUTSIDE_STATE_DICT,
        "error",
    ]
    assert ranked[1].scenarios == ("resume_1", "resume_2")
    assert len(ranked[1].reasons) == 2


def test_a_report_reads_as_the_diagnosis() -> None:
    reason = f"{diagnosis.OUTSIDE_STATE_DICT}: rank 0: step 4 differs"
    report = Report(
        False,
        MappingProxyType(
            {"resume_1": _result("resume_1", reason), "resume_2": _result("resume_2")}
        ),
        (Diagnosis(diagnosis.OUTSIDE_STATE_DICT, ("resume_1",), (reason,)),),
        Path("out"),
    )
    assert str(report).splitlines() == [
        f"dcp-invariant: fail: 1 passed, 1 failed; evidence in {Path('out')}",
        f"{diagnosis.OUTSIDE_STATE_DICT} (resume_1):",
        f"  - {reason}",
    ]


def test_a_run_finishes_with_the_artifact_the_suite_wrote_and_the_report_it_holds(
    tmp_path: Path,
) -> None:
    """python_api.finish is the one way a run ends, on this machine and in the user's job: from
    a real run's observations and provenance, the artifact that run wrote, byte for byte."""
    from artifact_data import DATA_ARTIFACT, read_observations, read_provenance

    from dcp_invariant.evidence import rules, schema
    from dcp_invariant.suite.output_dir import Reservation

    observations = read_observations(DATA_ARTIFACT)
    failing = "training_1_to_2"
    observations[failing]["errors"] = ["the driver stopped on FileNotFoundError"]
    reservation = Reservation(tmp_path / "out")
    try:
        report = python_api.finish(
            observations, read_provenance(DATA_ARTIFACT), plan.REGISTERED, reservation
        )
    finally:
        reservation.release()
    names = plan.SCENARIO_NAMES
    written = {
        p.relative_to(tmp_path / "out"): p.read_bytes()
        for p in (tmp_path / "out").rglob("*")
        if p.is_file()
    }
    shipped = {
        p.relative_to(DATA_ARTIFACT): p.read_bytes()
        for p in DATA_ARTIFACT.rglob("*")
        if p.is_file()
    }
    assert written.keys() == shipped.keys()
    # Only the failing scenario's files and what follows from its verdict differ.
    changed = {path.as_posix() for path in written if written[path] != shipped[path]}
    assert changed == {
        schema.observation_file(failing),
        schema.result_file(failing),
        schema.SUMMARY_FILE,
        schema.JUNIT_FILE,
        schema.MANIFEST_FILE,
    }
    assert not report.passed and report.artifact == tmp_path / "out"
    assert tuple(report.results) == names
    assert [r.name for r in report.results.values() if r.verdict == "fail"] == [failing]
    assert report.diagnoses[0].scenarios == (failing,)
    line = rules.verdict_line("fail", len(names) - 1, 1)
    assert report.summary == f"{line}; evidence in {tmp_path / 'out'}"
    assert str(report).splitlines()[0] == f"dcp-invariant: {report.summary}"
    assert sorted(tmp_path.iterdir()) == [tmp_path / "out"]  # no lock or stage left beside it


def test_a_run_that_wrote_nothing_says_fail_and_names_no_evidence() -> None:
    timed_out = Diagnosis("timeout", (), ("the fixture's first step took more than 20 s",))
    report = Report(False, MappingProxyType({}), (timed_out,), None)
    assert report.summary == "fail: 0 passed, 0 failed"
