"""pool.caller_main_hidden without processes: what multiprocessing would send a new process
(its preparation data) names no main module while a run is on, and the caller's comes back."""

from __future__ import annotations

import multiprocessing.spawn
import sys
import threading

from dcp_invariant.suite import pool


def _main_sent() -> set[str]:
    data = multiprocessing.spawn.get_preparation_data("probe")
    return {k for k in data if k.startswith("init_main")}


def test_no_main_module_is_sent_while_a_run_is_on_and_the_callers_comes_back() -> None:
    caller = sys.modules["__main__"]
    with pool.caller_main_hidden():
        assert _main_sent() == set()
        assert sys.modules["__main__"] is not caller
    assert sys.modules["__main__"] is caller


def test_runs_that_overlap_in_threads_give_the_callers_main_back_once_both_end() -> None:
    """Run A starts, run B starts, A ends, B ends: the caller's module is back, not A's
    stand-in."""
    caller = sys.modules["__main__"]
    a_started, a_may_end, b_started = threading.Event(), threading.Event(), threading.Event()
    seen: list[bool] = []

    def run_a() -> None:
        with pool.caller_main_hidden():
            a_started.set()
            a_may_end.wait(10)

    def run_b() -> None:
        a_started.wait(10)
        with pool.caller_main_hidden():
            b_started.set()
            a_may_end.set()
            first.join(10)  # A has ended
            seen.append(sys.modules["__main__"] is not caller)

    first = threading.Thread(target=run_a)
    second = threading.Thread(target=run_b)
    first.start()
    second.start()
    second.join(10)
    assert seen == [True]  # still hidden after A ended, while B runs
    assert sys.modules["__main__"] is caller
