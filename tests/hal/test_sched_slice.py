"""hal/sched_slice.py on this kernel: a thread's EEVDF slice set, read back and kept to it.

Skips where the kernel has no per-task slice (before 6.12: a normal thread's slice reads
back 0)."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from npumanager.errors import InvalidArgument
from npumanager.hal import sched_slice as ss

_DEFAULT = ss.slice_ns()
pytestmark = pytest.mark.skipif(not _DEFAULT, reason="no per-task EEVDF slice (Linux < 6.12)")


def _in_thread(fn: Callable[[], Any]) -> Any:
    """``fn``'s result, run on a fresh thread (so the test's own thread keeps its slice)."""
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(fn()))
    t.start()
    t.join(10)
    return got[0]


@pytest.fixture
def other_thread() -> Iterator[int]:
    """A parked thread's tid: a thread the calls below must leave alone."""
    tid: list[int] = []
    ready, stop = threading.Event(), threading.Event()

    def park() -> None:
        tid.append(threading.get_native_id())
        ready.set()
        stop.wait(30)

    t = threading.Thread(target=park)
    t.start()
    ready.wait(10)
    yield tid[0]
    stop.set()
    t.join(10)


def test_a_100_us_slice_reads_back_and_other_threads_keep_theirs(other_thread: int) -> None:
    before = ss.slice_ns(other_thread)

    def body() -> tuple[ss.SliceSet, int | None, ss.SliceSet, int | None]:
        got = ss.set_slice(100)
        short = ss.slice_ns()
        back = ss.set_slice(0)
        return got, short, back, ss.slice_ns()

    got, short, back, after = _in_thread(body)
    assert got.ok and bool(got), got.why
    assert short == got.after_ns == 100_000
    assert got.before_ns == _DEFAULT
    assert back.ok and after == _DEFAULT  # 0: the kernel's own again
    assert ss.slice_ns(other_thread) == before == _DEFAULT


def test_another_thread_by_tid_and_its_nice_value_kept(other_thread: int) -> None:
    os.setpriority(os.PRIO_PROCESS, other_thread, 5)
    got = ss.set_slice(3000, other_thread)
    assert got.ok, got.why
    attr = ss.get_attr(other_thread)
    assert attr is not None
    policy, _flags, nice, runtime = attr
    assert (policy, nice, runtime) == (os.SCHED_OTHER, 5, 3_000_000)
    assert os.getpriority(os.PRIO_PROCESS, other_thread) == 5
    assert ss.slice_ns() == _DEFAULT  # the caller's untouched


def test_batch_policy_is_kept() -> None:
    def body() -> tuple[ss.SliceSet, int]:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        return ss.set_slice(250), os.sched_getscheduler(0)

    got, policy = _in_thread(body)
    assert got.ok and got.after_ns == 250_000
    assert policy == os.SCHED_BATCH


@pytest.mark.parametrize("us", [-1, 1, 99, 100_001, 10**9, float("nan"), True, "300"])
def test_values_outside_the_kernels_range_are_a_typed_error(us: Any) -> None:
    with pytest.raises(InvalidArgument):
        ss.set_slice(us)
    assert ss.slice_ns() == _DEFAULT


def test_an_idle_thread_gets_no_slice_but_keeps_one_set_before() -> None:
    def body() -> tuple[ss.SliceSet, int | None, ss.SliceSet, int | None]:
        early = ss.set_slice(20_000)  # set while normal ...
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        kept = ss.slice_ns()  # ... kept at SCHED_IDLE
        late = ss.set_slice(500)
        return early, kept, late, ss.slice_ns()

    early, kept, late, after = _in_thread(body)
    assert early.ok and kept == 20_000_000
    assert not late and "SCHED_IDLE" in late.why
    assert after == 20_000_000


def test_a_gone_thread_is_refused_not_raised() -> None:
    child = subprocess.Popen(["true"])
    child.wait()  # reaped: its id names no task
    got = ss.set_slice(300, child.pid)
    assert not got.ok and "sched_getattr" in got.why


def test_set_this_thread_is_best_effort(caplog: pytest.LogCaptureFixture) -> None:
    def body() -> tuple[bool, bool, int | None]:
        ok = ss.set_this_thread(300, "test_slice_us")
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        refused = ss.set_this_thread(500, "test_slice_us")
        return ok, refused, ss.slice_ns()

    ok, refused, now = _in_thread(body)
    assert ok and not refused and now == 300_000
    assert not ss.set_this_thread(0, "test_slice_us")  # 0: nothing to do
