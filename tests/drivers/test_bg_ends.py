"""The ends of BACKGROUND burst steps are submitted on the host's normal-priority thread
(drivers/bg_ends.py), never on the lowered worker that ran the step: a preempted
SCHED_IDLE thread must not hold the host's lock the foreground burst threads need."""

from __future__ import annotations

import gc
import os
import threading
import weakref
from typing import Any

from npumanager.drivers.bg_ends import StepEnds
from npumanager.drivers.bg_threads import lower_this_thread
from npumanager.drivers.steps import Execution


def test_an_end_queued_on_a_sched_idle_worker_is_submitted_at_normal_priority() -> None:
    seen: list[tuple[str, int, int, Any]] = []
    done = threading.Event()

    def submit(ex: Execution, error: str | None, run_us: float) -> None:
        tid = threading.get_native_id()
        seen.append((threading.current_thread().name, os.sched_getscheduler(tid),
                     ex.ticket, (error, run_us)))
        done.set()

    ends = StepEnds("t", submit)
    ex = Execution(7, None, {}, {})

    def worker() -> None:
        lower_this_thread("idle", 19)
        assert os.sched_getscheduler(threading.get_native_id()) == os.SCHED_IDLE
        ends.put(ex, None, 12.5)

    t = threading.Thread(target=worker, name="npu-t-bg_0")
    t.start()
    t.join(30)
    try:
        assert done.wait(30)
        assert seen == [("npu-t-bgend", os.SCHED_OTHER, 7, (None, 12.5))]
    finally:
        ends.close()


class Marker:
    pass


def test_the_thread_keeps_no_execution_while_it_waits_and_survives_a_failed_end() -> None:
    """An execution holds the client's pool (a mapping, an fd): once its end is
    submitted nothing of it is kept; a submit that raises is logged, the next goes on."""
    calls: list[int] = []
    done = threading.Event()

    def submit(ex: Execution, error: str | None, run_us: float) -> None:
        calls.append(ex.ticket)
        if ex.ticket == 1:
            raise RuntimeError("the state failed")
        done.set()

    ends = StepEnds("t", submit)
    try:
        pool = Marker()  # stands in for what an execution holds
        ref = weakref.ref(pool)
        # (the failed one's traceback stays with the log record pytest captures)
        ends.put(Execution(1, None, {}, {}), "boom", 0.0)
        ends.put(Execution(2, None, {"x": pool}, {}), None, 0.0)
        del pool
        assert done.wait(30)
        for _ in range(100):
            gc.collect()
            if ref() is None and ends.ended == 2:
                break
            threading.Event().wait(0.01)
        assert calls == [1, 2] and ref() is None and ends.ended == 2
    finally:
        ends.close()
