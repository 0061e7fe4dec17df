"""drivers/rt_threads.py: a burst thread asks for SCHED_FIFO once per FOREGROUND stretch,
lowers itself on BACKGROUND work, after a long run, at its burst's close, and every FIFO
thread is lowered on SIGXCPU; a grant that comes after the thread stopped wanting it is
undone. npud's side is played by the test (root: hal/rt_sched.set_fifo), on a virtual
clock, with real threads whose policy is read back from the kernel."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from npumanager.drivers.rt_policy import RtPolicy
from npumanager.drivers.rt_threads import RtThreads
from npumanager.hal import rt_sched as rt
from npumanager.testing.clock import VirtualClock
from tests.hal.test_rt_sched import needs_fifo

pytestmark = needs_fifo


class Worker:
    """A thread that runs what it is given, in order (a burst's thread)."""

    def __init__(self) -> None:
        self.jobs: queue.Queue[tuple[Callable[[], Any], queue.Queue[Any]] | None] = \
            queue.Queue()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        self.tid = self.do(threading.get_native_id)

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            fn, out = job
            out.put(fn())

    def do(self, fn: Callable[[], Any]) -> Any:
        out: queue.Queue[Any] = queue.Queue()
        self.jobs.put((fn, out))
        return out.get(timeout=10)

    def policy(self) -> int:
        s = rt.sched_of(self.tid)
        assert s is not None
        return s.policy

    def end(self) -> None:
        self.jobs.put(None)
        self.thread.join(10)


class Npud:
    """The requests the host sent; ``grant`` applies one as npud would."""

    def __init__(self) -> None:
        self.asked: list[tuple[int, int]] = []
        self.attached = True

    def ask(self, tid: int, priority: int) -> bool:
        if self.attached:
            self.asked.append((tid, priority))
        return self.attached


@pytest.fixture
def parts() -> Iterator[tuple[RtThreads, Npud, Worker, VirtualClock]]:
    clock, npud, w = VirtualClock(), Npud(), Worker()
    rts = RtThreads(1, 5000, clock, lambda fn: fn(), npud.ask)
    yield rts, npud, w, clock
    rt.set_other(w.tid)
    w.end()


def grant(rts: RtThreads, tid: int) -> None:
    assert rt.set_fifo(tid, 1, tgid=os.getpid()).ok
    rts.applied(tid, True, "")


def test_fifo_while_foreground_lowered_by_itself_on_background(
        parts: tuple[RtThreads, Npud, Worker, VirtualClock]) -> None:
    rts, npud, w, _ = parts
    p = RtPolicy()
    w.do(lambda: rts.serve(p, True))
    w.do(lambda: rts.serve(p, True))
    assert npud.asked == [(w.tid, 1)]  # once per stretch
    grant(rts, w.tid)
    assert w.policy() == os.SCHED_FIFO and rts.counts()["wanted"] == 1
    w.do(lambda: rts.serve(p, False))
    assert w.policy() == os.SCHED_OTHER
    w.do(lambda: rts.serve(p, True))
    assert npud.asked == [(w.tid, 1)] * 2
    assert rts.counts()["granted"] == 1


def test_a_grant_after_the_thread_stopped_wanting_it_is_undone(
        parts: tuple[RtThreads, Npud, Worker, VirtualClock]) -> None:
    rts, _npud, w, _ = parts
    p = RtPolicy()
    w.do(lambda: rts.serve(p, True))
    w.do(lambda: rts.serve(p, False))  # background before npud's answer
    grant(rts, w.tid)
    assert w.policy() == os.SCHED_OTHER
    assert rts.counts()["lowered_late"] == 1


def test_a_long_run_lowers_and_no_asking_for_the_backoff(
        parts: tuple[RtThreads, Npud, Worker, VirtualClock]) -> None:
    rts, npud, w, clock = parts
    p = RtPolicy()
    w.do(lambda: rts.serve(p, True))
    grant(rts, w.tid)
    w.do(lambda: rts.ran(p, 4000))
    assert w.policy() == os.SCHED_FIFO
    w.do(lambda: rts.ran(p, 5001))
    assert w.policy() == os.SCHED_OTHER and rts.lowered_long == 1
    clock.advance(0.5)
    w.do(lambda: rts.serve(p, True))
    assert len(npud.asked) == 1
    clock.advance(0.5)
    w.do(lambda: rts.serve(p, True))
    assert len(npud.asked) == 2


def test_sigxcpu_lowers_every_fifo_thread_and_close_forgets(
        parts: tuple[RtThreads, Npud, Worker, VirtualClock]) -> None:
    rts, npud, w, clock = parts
    w2 = Worker()
    try:
        p, p2 = RtPolicy(), RtPolicy()
        w.do(lambda: rts.serve(p, True))
        w2.do(lambda: rts.serve(p2, True))
        grant(rts, w.tid)
        grant(rts, w2.tid)
        assert rts.demote_all() == 2
        assert w.policy() == w2.policy() == os.SCHED_OTHER
        assert not p.want and not p2.want
        w.do(lambda: rts.serve(p, True))
        assert len(npud.asked) == 2  # backing off
        clock.advance(1.0)
        w2.do(lambda: rts.serve(p2, True))
        grant(rts, w2.tid)
        w2.do(lambda: rts.closed(p2))
        assert w2.policy() == os.SCHED_OTHER and rts.counts()["wanted"] == 0
        assert rts.demote_all() == 0
    finally:
        rt.set_other(w2.tid)
        w2.end()


def test_refused_for_want_of_privilege_asks_no_more(
        parts: tuple[RtThreads, Npud, Worker, VirtualClock]) -> None:
    rts, npud, w, clock = parts
    p = RtPolicy()
    w.do(lambda: rts.serve(p, True))
    rts.applied(w.tid, False, "sched_setscheduler: Operation not permitted")
    assert rts.refused and not p.want
    clock.advance(10)
    w.do(lambda: rts.serve(p, False))
    w.do(lambda: rts.serve(p, True))
    assert len(npud.asked) == 1 and w.policy() == os.SCHED_OTHER


def test_no_npud_attached_asks_again_at_the_next_change(
        parts: tuple[RtThreads, Npud, Worker, VirtualClock]) -> None:
    rts, npud, w, _ = parts
    npud.attached = False
    p = RtPolicy()
    w.do(lambda: rts.serve(p, True))
    assert not p.want
    npud.attached = True
    w.do(lambda: rts.serve(p, True))
    assert npud.asked == [(w.tid, 1)]


def test_a_refusal_backs_off_instead_of_asking_every_frame(
        parts: tuple[RtThreads, Npud, Worker, VirtualClock]) -> None:
    rts, npud, w, clock = parts
    p = RtPolicy()
    w.do(lambda: rts.serve(p, True))
    rts.applied(w.tid, False, "host process 1 is cooling down")
    assert not rts.refused and not p.want
    for _ in range(10):  # frames within the back-off: no request
        clock.advance(0.05)
        w.do(lambda: rts.serve(p, True))
    assert len(npud.asked) == 1
    clock.advance(0.51)  # (the back-off, 1 s, is over)
    w.do(lambda: rts.serve(p, True))
    assert len(npud.asked) == 2


def test_npud_gone_lowers_every_fifo_thread_and_the_next_npud_is_asked_at_once(
        parts: tuple[RtThreads, Npud, Worker, VirtualClock]) -> None:
    """npud's link closed (its CPU watchdog gone with it): lowered, and asked again at
    the next FOREGROUND step without a back-off, of whichever npud attaches."""
    rts, npud, w, _ = parts
    p = RtPolicy()
    w.do(lambda: rts.serve(p, True))
    grant(rts, w.tid)
    assert w.policy() == os.SCHED_FIFO
    npud.attached = False
    assert rts.npud_gone() == 1
    assert w.policy() == os.SCHED_OTHER and not p.want
    assert rts.counts()["lowered_gone"] == 1
    w.do(lambda: rts.serve(p, True))  # no npud: asks, nothing comes
    assert len(npud.asked) == 1 and not p.want
    npud.attached = True  # the next npud attached
    w.do(lambda: rts.serve(p, True))
    assert npud.asked == [(w.tid, 1)] * 2
    assert rts.npud_gone() == 0  # (nothing at FIFO: nothing to lower)
