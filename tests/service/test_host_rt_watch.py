"""service/host_rt_watch.py: a host thread at FIFO that uses more than its CPU budget in a
window is demoted and its host cools down; a frame thread's few ms are left alone."""

from __future__ import annotations

from npumanager.service.host_rt_watch import HostRtWatch
from npumanager.testing.clock import VirtualClock

MS = 1_000_000


def test_a_frame_thread_stays_and_a_spinner_is_demoted_within_budget_plus_a_sample() -> None:
    clock, w = VirtualClock(), HostRtWatch(200, 1.0, 10.0)
    w.granted(10, 11, clock.now(), 0)
    w.granted(10, 12, clock.now(), 0)
    frame = spin = 0
    for _ in range(40):  # 6 s at 0.15 s: the frame thread 5 ms per sample, the spinner 150
        clock.advance(0.15)
        frame += 5 * MS
        spin += 150 * MS
        out = w.tick(clock.now(), {(10, 11): frame, (10, 12): spin if (10, 12) in
                                   w.watched() else None})
        if out:
            assert out == [(10, 12)]
            assert spin <= 200 * MS + 150 * MS
            break
    else:
        raise AssertionError("the spinner was never demoted")
    assert w.watched() == [(10, 11)] and w.demoted == 1
    assert w.cooling(10, clock.now()) and not w.cooling(99, clock.now())
    clock.advance(10.0)
    assert not w.cooling(10, clock.now())
    for _ in range(40):
        clock.advance(0.15)
        frame += 5 * MS
        assert w.tick(clock.now(), {(10, 11): frame}) == []


def test_gone_or_lowered_threads_are_forgotten() -> None:
    clock, w = VirtualClock(), HostRtWatch()
    w.granted(10, 11, clock.now(), 0)
    clock.advance(0.15)
    assert w.tick(clock.now(), {(10, 11): None}) == [] and w.watched() == []
    assert not w.cooling(10, clock.now())
