"""The walk of an app's own objects (ranks/app_objects.py): what it fingerprints, by which path,
and what it never does (call a property, follow a cycle forever, run past its bounds)."""

from __future__ import annotations

import threading
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from dcp_invariant.ranks import app_objects  # noqa: E402

pytestmark = pytest.mark.torch


class Sampler:
    def __init__(self) -> None:
        self.epoch = 0
        self.seed = 7


class Loop:
    """A loop with everything that steers training somewhere other than a state dict."""

    def __init__(self) -> None:
        init = torch.Generator().manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
        for p in self.model.parameters():
            torch.nn.init.uniform_(p, generator=init)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=0.1)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optim, lambda s: 1.0 / (s + 1))
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**4)
        self.teacher = torch.optim.swa_utils.AveragedModel(self.model)
        self.generator = torch.Generator().manual_seed(1)
        self.sampler = Sampler()
        self.steps = 0
        self.lock = threading.Lock()  # a process's resource: never walked
        self.on_step = print  # a function: never walked

    def step(self) -> None:
        x = torch.rand(2, 4, generator=self.generator)
        loss = self.model(x).square().mean()
        self.optim.zero_grad()
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optim)
        self.scaler.update()
        self.scheduler.step()
        self.teacher.update_parameters(self.model)
        self.steps += 1


def test_what_steers_training_is_found_by_its_attribute_path() -> None:
    loop = Loop()
    loop.step()
    found = app_objects.fingerprints(loop)
    for path in (
        "app.model.0.weight",
        "app.optim.state.0.exp_avg",
        "app.optim.state.0.step",
        "app.optim.param_groups.0.lr",
        "app.scheduler.last_epoch",
        "app.scaler._scale",
        "app.scaler._growth_tracker",
        "app.teacher.module.0.weight",
        "app.teacher.n_averaged",
        "app.generator",
        "app.sampler.epoch",
        *app_objects.GLOBAL_RNGS,
    ):
        assert path in found, sorted(found)
    assert found["app.steps"] == "int 1"
    assert found["app.sampler.epoch"] == "int 0"
    assert found["app.optim.param_groups.0.params"] == "int 4"  # counted; the model has them
    assert found["app.model.0.weight"].startswith("float32[4,4] ")
    assert not any(p.startswith(("app.lock", "app.on_step")) for p in found), sorted(found)
    assert list(found) == sorted(found)


def test_two_walks_differ_exactly_where_the_objects_do() -> None:
    torch.manual_seed(0)
    first, second = Loop(), Loop()
    for loop in (first, second):
        loop.step()
    torch.manual_seed(0)
    a = app_objects.fingerprints(first)
    torch.manual_seed(0)
    b = app_objects.fingerprints(second)
    assert a == b
    second.sampler.epoch = 3
    with torch.no_grad():
        second.teacher.module[0].weight.add_(1)
    second.scaler.update(new_scale=1.0)
    b = app_objects.fingerprints(second)
    assert sorted(k for k in a if a[k] != b[k]) == [
        "app.sampler.epoch",
        "app.scaler._scale",
        "app.teacher.module.0.weight",
    ]
    assert b["app.sampler.epoch"] == "int 3"


def test_the_global_rngs_are_recorded_beside_the_app() -> None:
    torch.manual_seed(0)
    before = app_objects.fingerprints(object())
    torch.rand(1)
    after = app_objects.fingerprints(object())
    assert before["rng.torch"] != after["rng.torch"]
    assert before["rng.python"] == after["rng.python"]


class Tricky:
    """Attributes the walk must not call or loop on."""

    __slots__ = ("__dict__", "slot_value", "unset_slot")

    def __init__(self) -> None:
        self.slot_value = 5
        self.me = self
        self.child = {"parent": self}

    @property
    def exploding(self) -> Any:
        raise AssertionError("the walk called a property")

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the walk asked for {name!r}")

    def __getattribute__(self, name: str) -> Any:
        if name not in ("slot_value", "me", "child", "__class__"):
            raise AssertionError(f"the walk asked for {name!r}")
        return object.__getattribute__(self, name)


def test_properties_are_never_called_and_cycles_end() -> None:
    found = app_objects.fingerprints(Tricky())
    app = {k: v for k, v in found.items() if k.startswith("app")}
    assert app == {"app.slot_value": "int 5"}


def test_the_walk_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    class Deep:
        def __init__(self, depth: int) -> None:
            self.value = depth
            self.next = Deep(depth - 1) if depth else None

    monkeypatch.setattr(app_objects, "MAX_DEPTH", 3)
    found = app_objects.fingerprints(Deep(10))
    assert found["app.next.next.value"] == "int 8"
    assert found["app.next.next.next"] == "Deep (deeper than 3)"
    big = {"items": list(range(app_objects.MAX_ENTRIES + 1)), "few": [1, 2]}
    found = app_objects.fingerprints(big)
    assert "app.few.1" in found and not any(k.startswith("app.items.") for k in found)
    monkeypatch.setattr(app_objects, "MAX_ATTRIBUTES", 50)
    found = app_objects.fingerprints({"n": list(range(200))})
    assert len([k for k in found if k.startswith("app.")]) == 48
    # Where it stopped is recorded under a key of its own, never at an attribute's path.
    assert found[app_objects.CUT_KEY] == "stopped at app.n.48 (past 50 attributes)"


def test_ignored_attributes_are_not_walked_and_spend_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An ignored path, and all below it, is neither recorded nor counted against the cap: the
    attributes after it are walked whole."""
    monkeypatch.setattr(app_objects, "MAX_ATTRIBUTES", 10)
    app = {"a_cache": list(range(100)), "b": [1, 2, 3]}
    found = app_objects.fingerprints(app, ignoring=["app.a_cache", "rng.python"])
    assert [k for k in found if k.startswith("app.")] == ["app.b.0", "app.b.1", "app.b.2"]
    assert "rng.python" not in found and "rng.torch" in found
    cut = app_objects.fingerprints(app)
    assert "app.b.0" not in cut


def test_an_ignored_object_is_not_walked_where_another_path_reaches_it() -> None:
    """An ignored optimizer is also its scheduler's: it is left out there too."""
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    app = {"opt": optimizer, "sched": scheduler}
    found = app_objects.fingerprints(app, ignoring=["app.opt"])
    assert not any(".optimizer." in k or k.startswith("app.opt") for k in found), found
    assert any(k.startswith("app.sched.") for k in found)


def test_keys_that_are_object_ids_are_named_by_their_place() -> None:
    """A dict keyed by id(param) would put addresses in the paths, which differ from process to
    process: such keys are named #0, #1... in insertion order."""
    params = [torch.zeros(2), torch.ones(2)]
    found = app_objects.fingerprints({"by_id": {id(p): p for p in params}, "small": {7: 1}})
    assert found["app.by_id.#1"].startswith("float32[2] ")
    assert found["app.by_id.#0"] != found["app.by_id.#1"]
    assert found["app.small.7"] == "int 1"
    assert not any(str(id(p)) in k for p in params for k in found)


def test_a_tensor_without_data_is_named_by_its_kind() -> None:
    found = app_objects.fingerprints({"meta": torch.empty(3, device="meta")})
    assert found["app.meta"] == "float32[3] torch.strided meta"


def test_a_closures_cells_are_walked_and_strings_and_odd_keys_never_shown() -> None:
    """A loop written as functions keeps its cursor in a cell; a string or a key that is not a
    plain name could be a path: a string is recorded by kind, a key by digest."""
    cursor = 3

    def step() -> int:
        nonlocal cursor
        cursor += 1
        return cursor

    found = app_objects.fingerprints({"step": step, "where": "/home/someone/data", "/etc/hosts": 1})
    assert found["app.step.cursor"] == "int 3"
    assert found["app.where"] == "str"
    assert not any("/etc" in path for path in found), sorted(found)
    assert any(path.startswith("app.key~") for path in found), sorted(found)


def test_a_container_shared_by_two_attributes_is_recorded_at_both() -> None:
    """Whether two attributes share one tuple is not state (a load copies them apart), so the
    paths recorded do not depend on it; a cycle through a container still ends."""
    betas = (0.9, 0.999)
    shared = app_objects.fingerprints({"defaults": {"betas": betas}, "group": {"betas": betas}})
    apart = app_objects.fingerprints(
        {"defaults": {"betas": betas}, "group": {"betas": (0.9, 0.999)}}
    )
    assert shared == apart
    assert shared["app.group.betas.1"] == f"float {(0.999).hex()}"
    looped: list[object] = [1]
    looped.append(looped)
    assert {k: v for k, v in app_objects.fingerprints(looped).items() if k.startswith("app")} == {
        "app.0": "int 1"
    }


def test_what_a_user_object_raises_while_read_is_recorded_never_raised() -> None:
    """A closed shelf, a lazy module before its first forward: a correct loop's rank must not
    end in the walk."""

    class Raises:
        __slots__ = ("value",)

        def __init__(self) -> None:
            self.value = 1

        def __getattribute__(self, name: str) -> Any:
            raise RuntimeError(f"no {name}")

    found = app_objects.fingerprints({"odd": Raises(), "lazy": torch.nn.LazyLinear(2)})
    assert found["app.lazy.weight"] == "uninitialized"
    assert found["app.odd.value"] == "int 1"  # a slot is read by its descriptor, not by the object


def test_fsdp_modules_and_long_optimizer_state_are_walked() -> None:
    """A module's class under torch.distributed (FSDP's) is still a module; an optimizer's state
    is walked whatever the number of parameters (a 7B model has about 300 tensors)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    assert ZeroRedundancyOptimizer.__module__.startswith("torch.distributed")
    params = [torch.nn.Parameter(torch.ones(1)) for _ in range(300)]
    optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    loss = sum(p.sum() for p in params)
    loss.backward()
    optimizer.step()
    found = app_objects.fingerprints({"optim": optimizer, "many": list(range(300))})
    assert "app.optim.state.299.momentum_buffer" in found
    assert found["app.many"] == "list of 300 entries"


def test_numpy_arrays_are_hashed_by_their_bytes_and_object_arrays_by_kind() -> None:
    numpy = pytest.importorskip("numpy")
    found = app_objects.fingerprints(
        {"a": numpy.arange(4), "b": numpy.arange(4), "o": numpy.array([object()])}
    )
    assert found["app.a"] == found["app.b"] and found["app.a"].startswith("ndarray int64[4] ")
    assert found["app.o"] == "ndarray object[1]"
