"""hal/rt_sched.py on this kernel: a thread into SCHED_FIFO and back, read from the kernel
and /proc; its owner and CPU time. The FIFO tests need CAP_SYS_NICE (root here) and skip
without it; the unprivileged side is tests/security/test_rt_sched.py."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator

import pytest

from npumanager.errors import InvalidArgument
from npumanager.hal import rt_sched as rt

#: FIFO spinners here: one such test at a time (tests/conftest.py).
pytestmark = pytest.mark.fifo


def _can_fifo() -> bool:
    """Whether this process may put a thread at SCHED_FIFO (tried on a throwaway thread, so
    the caller keeps its own policy and flags)."""
    got: list[bool] = []

    def probe() -> None:
        got.append(rt.set_fifo(0, 1).ok)
        rt.set_other(0)

    t = threading.Thread(target=probe)
    t.start()
    t.join(10)
    return bool(got and got[0])


needs_fifo = pytest.mark.skipif(not _can_fifo(), reason="no CAP_SYS_NICE: SCHED_FIFO refused")


class Parked:
    """A thread blocked on an event (so a FIFO policy on it costs no CPU)."""

    def __init__(self) -> None:
        self.ready, self.stop = threading.Event(), threading.Event()
        self.tid = 0
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        assert self.ready.wait(10)

    def _run(self) -> None:
        self.tid = threading.get_native_id()
        self.ready.set()
        self.stop.wait(30)

    def end(self) -> None:
        self.stop.set()
        self.thread.join(10)


@pytest.fixture
def parked() -> Iterator[Parked]:
    p = Parked()
    yield p
    p.end()


@needs_fifo
def test_fifo_and_back_nice_kept(parked: Parked) -> None:
    os.setpriority(os.PRIO_PROCESS, parked.tid, 3)
    got = rt.set_fifo(parked.tid, 2)
    assert got.ok and bool(got), got.why
    s = rt.sched_of(parked.tid)
    assert s == rt.ThreadSched(os.SCHED_FIFO, 2, True) and s.fifo
    assert rt.sched_of(0) == rt.ThreadSched(os.SCHED_OTHER, 0, False)  # the caller's untouched
    back = rt.set_other(parked.tid)
    assert back.ok, back.why
    s = rt.sched_of(parked.tid)
    assert s is not None and (s.policy, s.priority, s.fifo) == (os.SCHED_OTHER, 0, False)
    assert s.reset_on_fork  # kept: an unprivileged thread could not clear it
    assert os.getpriority(os.PRIO_PROCESS, parked.tid) == 3


@needs_fifo
def test_fifo_with_tgid_checks_the_process(parked: Parked) -> None:
    assert rt.set_fifo(parked.tid, 1, tgid=os.getpid()).ok
    assert rt.sched_of(parked.tid) == rt.ThreadSched(os.SCHED_FIFO, 1, True)
    rt.set_other(parked.tid)
    other = rt.set_fifo(parked.tid, 1, tgid=os.getpid() + 1)
    assert not other.ok and "not a thread of process" in other.why
    s = rt.sched_of(parked.tid)
    assert s is not None and s.policy == os.SCHED_OTHER


def test_priorities_outside_the_range_are_refused(parked: Parked) -> None:
    for bad in (0, 11, 99, -1, True, 1.0, "1"):
        with pytest.raises(InvalidArgument):
            rt.set_fifo(parked.tid, bad)  # type: ignore[arg-type]
    assert rt.check_priority(rt.MIN_PRIORITY) == 1 and rt.check_priority(rt.MAX_PRIORITY) == 10
    with pytest.raises(InvalidArgument):
        rt.sched_of(-5)
    s = rt.sched_of(parked.tid)
    assert s is not None and s.policy == os.SCHED_OTHER


def test_owner_of_any_thread_id(parked: Parked) -> None:
    assert rt.owner_of(parked.tid) == rt.ThreadOwner(os.getpid(), os.getuid())
    assert rt.owner_of(os.getpid()) == rt.ThreadOwner(os.getpid(), os.getuid())
    assert rt.owner_of(1) == rt.ThreadOwner(1, 0)
    assert rt.is_thread_of(parked.tid, os.getpid())
    assert not rt.is_thread_of(parked.tid, 1)
    assert not rt.is_thread_of(0, os.getpid())


def test_a_thread_gone_reads_none() -> None:
    p = Parked()
    tid = p.tid
    p.end()
    deadline = time.monotonic() + 10  # join() returns before the kernel has reaped the thread
    while os.path.exists(f"/proc/{os.getpid()}/task/{tid}") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rt.owner_of(tid) is None
    assert rt.sched_of(tid) is None
    assert rt.cpu_ns(tid) is None
    assert not rt.set_other(tid).ok
    gone = rt.set_fifo(tid, 1, tgid=os.getpid())
    assert not gone.ok


def test_cpu_ns_counts_a_spinning_threads_time(parked: Parked) -> None:
    got: list[tuple[int | None, int | None, int | None]] = []

    def spin() -> None:
        me = threading.get_native_id()
        a = rt.cpu_ns(me, os.getpid())
        t_end = rt.cpu_ns(0)
        assert t_end is not None
        while (rt.cpu_ns(0) or 0) - t_end < 20_000_000:  # 20 ms of CPU
            pass
        got.append((a, rt.cpu_ns(me, os.getpid()), rt.cpu_ns(me)))

    t = threading.Thread(target=spin)
    t.start()
    t.join(30)
    a, b, c = got[0]
    assert a is not None and b is not None and c is not None
    assert b - a >= 20_000_000 and c >= b
    # Read under another process, a thread id reads None.
    assert rt.cpu_ns(parked.tid, 1) is None
    assert (rt.cpu_ns(parked.tid, os.getpid()) or 0) >= 0
