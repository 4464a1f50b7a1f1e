"""State digests (ranks/digest.py): within one phase a tensor's bytes are hashed once, and a
digest is never handed to other bytes that came to sit at the same address."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from dcp_invariant.ranks import digest  # noqa: E402

pytestmark = pytest.mark.torch


def counting(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    fed: list[Any] = []
    feed = digest._feed

    def counted(h: Any, value: Any) -> None:
        fed.append(value)
        feed(h, value)

    monkeypatch.setattr(digest, "_feed", counted)
    return fed


def test_a_phase_hashes_the_same_bytes_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A parameter and the detached view a state dict holds of it: one hash."""
    fed = counting(monkeypatch)
    weight = torch.nn.Parameter(torch.rand(64, 64))
    with digest.remembering():
        first = digest.value_digest(weight.detach())
        second = digest.value_digest(weight)
    assert first == second and len(fed) == 1
    assert digest.value_digest(weight) == first and len(fed) == 2  # outside: hashed again


def test_a_view_elsewhere_in_the_same_memory_is_its_own_value() -> None:
    base = torch.arange(8.0)
    with digest.remembering():
        head, tail = digest.value_digest(base[:4]), digest.value_digest(base[4:])
        assert head != tail
        assert digest.value_digest(base.view(2, 4)) != digest.value_digest(base)


def test_bytes_that_take_a_freed_tensors_place_get_their_own_digest() -> None:
    """A generator's get_state() is a new tensor each time: held until the phase ends, the
    first one's memory cannot go to the second, which would then read as the first."""
    gen = torch.Generator().manual_seed(0)
    with digest.remembering():
        before = digest.value_digest(gen.get_state())
        torch.rand(3, generator=gen)
        after = digest.value_digest(gen.get_state())
    assert before != after
    assert after == digest.value_digest(gen.get_state())


def test_what_is_not_a_plain_tensor_is_hashed_each_time(monkeypatch: pytest.MonkeyPatch) -> None:
    fed = counting(monkeypatch)
    values = [{"a": 1}, torch.quantize_per_tensor(torch.rand(4), 0.1, 0, torch.quint8)]
    with digest.remembering():
        for value in values * 2:
            digest.value_digest(value)
    assert [sum(v is value for v in fed) for value in values] == [2, 2]
