"""The runner's wait for its scenario threads: an interrupt or a scenario's error ends it at once."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from dcp_invariant import plan
from dcp_invariant.suite import runner

# Each scenario thread of these tests waits at most this long; the old wait took all of it.
HELD = 30.0


class Interrupted(BaseException):
    pass


@pytest.fixture
def released() -> Iterator[threading.Event]:
    """Set when the test ends, so a thread still waiting on it ends too."""
    event = threading.Event()
    try:
        yield event
    finally:
        event.set()


def _held(released: threading.Event) -> None:
    released.wait(HELD)


def test_a_signal_another_thread_receives_still_ends_the_wait_at_once(
    released: threading.Event,
) -> None:
    if sys.platform == "win32":
        pytest.skip("no pthread_kill")

    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    sent: list[float] = []

    def receives_the_signal() -> None:
        time.sleep(0.2)  # the main thread is waiting by then
        # Where the kernel may deliver a process's signal: to a thread that is not the main one.
        sent.append(time.monotonic())
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
        released.wait(HELD)

    saved = signal.signal(signal.SIGUSR1, interrupt)
    try:
        with ThreadPoolExecutor(2) as executor:
            with pytest.raises(Interrupted):
                runner._results(
                    [executor.submit(_held, released), executor.submit(receives_the_signal)]
                )
            elapsed = time.monotonic() - sent[0]
            released.set()
    finally:
        signal.signal(signal.SIGUSR1, saved)
    assert elapsed < HELD / 3, f"{elapsed:.1f} s"


def test_a_later_scenarios_error_ends_the_wait_before_the_earlier_ones_finish(
    released: threading.Event,
) -> None:
    def fails() -> None:
        raise KeyError("a driver's bug")

    with ThreadPoolExecutor(2) as executor:
        futures = [executor.submit(_held, released), executor.submit(fails)]
        started = time.monotonic()
        with pytest.raises(KeyError, match="a driver's bug"):
            runner._results(futures)
        elapsed = time.monotonic() - started
        released.set()
    assert elapsed < HELD / 3, f"{elapsed:.1f} s"


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (None, "elastic_restart_2_to_2"),
        (["resume_2", "half_written_2", "elastic_restart_2_to_2"], "elastic_restart_2_to_2"),
        (["resume_2", "half_written_2"], None),  # half_written_2: only the probe's finding adds it
    ],
)
def test_the_restart_whose_agent_starts_ahead_is_found_before_the_probe(
    names: list[str] | None, expected: str | None
) -> None:
    assert runner._restart_scenario(plan.fixture_plan("m:f", (1, 2)), names) == expected
    assert runner._restart_scenario(plan.fixture_plan("m:f", (1,)), names) is None
