"""The fixture probe (ranks/fixture_tasks.py), in this process: what it reports of an app that
steps outside the interface, before any scenario runs. That such a report becomes the CLI's one
line and exit 2, with nothing written, is shown end to end in tests/suite/test_fixture_live.py."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("torch")

from dcp_invariant.ranks.fixture_tasks import fixture_probe
from dcp_invariant.suite.scenarios.payloads import FixtureProbe

pytestmark = pytest.mark.torch


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no_step", "lacks step()"),
        ("not_a_mapping", "state_dict() returned a list, not a mapping"),
        ("bad_loss", "step() returned nan, expected a finite float"),
        # What DCP cannot save (measured with dcp.save at world size 1), named by key; every
        # kind of it is in test_state_keys.py, and one goes through the CLI.
        (
            "meta_state",
            "state_dict() holds app.extra.value, a tensor on the meta device (layout "
            "torch.strided, device meta), which DCP cannot save",
        ),
        (
            "expanded_state",
            "state_dict() holds app.extra.value, an expanded tensor (layout torch.strided, "
            "device cpu, strides [0]), which DCP saves but cannot load into",
        ),
        (
            "nested_state",
            "state_dict() holds app.extra.value, a nested tensor (layout torch.jagged, device "
            "cpu), which DCP cannot save",
        ),
    ],
)
def test_the_probe_reports_an_app_outside_the_interface_as_its_problem(
    one_rank_group: Any, name: str, message: str
) -> None:
    reported: list[dict[str, Any]] = []
    spec = f"fixture_loops:{name}"
    fixture_probe(0, 1, {"fixture": spec, "fixture_args": {}, "rank_local": []}, reported.append)
    last = reported[-1]
    assert last["phase"] == "done", reported
    assert last["problem"] is not None and last["problem"].startswith(f"fixture {spec!r}")
    assert message in last["problem"], last["problem"]
    assert "\n" not in last["problem"]


def test_the_probe_of_a_correct_app_reports_no_problem(one_rank_group: Any) -> None:
    reported: list[dict[str, Any]] = []
    payload: FixtureProbe = {
        "fixture": "fixture_loops:correct",
        "fixture_args": {},
        "rank_local": [],
    }
    fixture_probe(0, 1, payload, reported.append)
    assert [r["phase"] for r in reported] == [
        "build",
        "state_dict",
        "step",
        "state_dict_after_step",
        "done",
    ]
    assert reported[-1]["problem"] is None
