"""A burst's anticipation (drivers/anticipate.py): which streams get a poll window and
where it lies (pure, on explicit times), and the burst thread's wait for the next request
(a real socketpair and eventfd, a header in a bytearray). No test here measures time:
windows are either long past or far ahead, or the answer comes from a doorbell."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator

import pytest

from npumanager.drivers import burst_counters as bc
from npumanager.drivers.anticipate import (
    COARSE_S,
    KEPT,
    KEPT_OVERSLEEPS,
    MAX_SHARE,
    PAUSE,
    WARM_MAX_RUN_US,
    Anticipate,
    Anticipation,
    await_request,
    low_timer_slack,
)
from npumanager.drivers.burst_counters import BurstCounters
from npumanager.tensorio import burst as layout


def stream(a: Anticipation, period: float, n: int = KEPT + 1, start: float = 100.0,
           jitter: list[float] | None = None) -> float:
    """``n`` arrivals every ``period`` (plus ``jitter[i]``); the last one's time."""
    t = start
    for i in range(n):
        t = start + i * period + (jitter[i % len(jitter)] if jitter else 0.0)
        a.arrived(t)
    return t


def test_a_steady_stream_gets_a_window_around_its_next_request() -> None:
    a = Anticipation(300e-6)
    last = stream(a, 1 / 30)
    assert a.period == pytest.approx(1 / 30)
    plan = a.plan(last + 0.001)
    assert plan is not None
    due = last + 1 / 30
    # The window holds the due time, is 300 µs long and opens mostly before it.
    assert plan.wake_at == plan.opens < due < plan.spin_until
    assert plan.spin_until - plan.opens == pytest.approx(300e-6)
    assert due - plan.opens > plan.spin_until - due


def test_no_window_before_enough_intervals_or_for_an_irregular_stream() -> None:
    a = Anticipation(300e-6)
    last = stream(a, 0.01, n=KEPT)  # KEPT arrivals: one interval short
    assert a.period is None and a.plan(last) is None
    a.arrived(last + 0.01)
    assert a.period is not None
    # One interval 20 % off the pace: no pace until it has left the kept ones.
    last += 0.01
    a.arrived(last + 0.012)
    last += 0.012
    assert a.plan(last) is None
    for _ in range(KEPT - 1):
        last += 0.01
        a.arrived(last)
        assert a.period is None
    a.arrived(last + 0.01)
    assert a.period == pytest.approx(0.01)


def test_a_voice_assistants_irregular_requests_get_no_window() -> None:
    a = Anticipation(300e-6)
    last = stream(a, 0.03, n=3 * KEPT, jitter=[0.0, 0.01, -0.008, 0.02, 0.0, -0.012])
    assert a.period is None and a.plan(last) is None


def phrases(a: Anticipation, n: int, each: int = 8, period: float = 0.03,
            pause: float = 0.49, start: float = 100.0) -> float:
    """``n`` phrases of ``each`` arrivals ``period`` apart, ``pause`` between phrases (the
    contention bench's voice assistant); the last arrival's time."""
    t = start
    for _ in range(n):
        for i in range(each):
            a.arrived(t)
            t += period if i < each - 1 else pause
    return t - pause


def test_a_stream_that_pauses_between_phrases_keeps_its_pace() -> None:
    """burst_anticipate_pauses (voice30): a voice assistant's phrases, 8 requests 30 ms
    apart then a pause, are anticipated from the second request of each phrase on."""
    a = Anticipation(300e-6, pauses=PAUSE)
    last = phrases(a, 1)
    assert a.period is None  # one phrase: 7 intervals, one short of KEPT
    last = phrases(a, 3, start=last + 0.49)
    assert a.period == pytest.approx(0.03)
    # The phrase's last request: a window one period on (no request comes: the doorbell).
    plan = a.plan(last + 0.001)
    assert plan is not None and plan.opens < last + 0.03 < plan.spin_until
    # The pause: not an interval of the pace, and the phase starts anew at its end.
    first = last + 0.49
    a.arrived(first)
    assert a.period == pytest.approx(0.03) and a.recent == [first]
    plan = a.plan(first + 0.001)
    assert plan is not None and plan.opens < first + 0.03 < plan.spin_until
    assert all(abs(r) < 0.015 for r in a.residuals)  # (the pause's offset not kept)
    # Without the key a pause breaks the pace, and KEPT intervals never agree.
    b = Anticipation(300e-6)
    phrases(b, 4)
    assert b.period is None


def test_two_pauses_in_a_row_are_a_slower_pace() -> None:
    """A stream going from 30 to 10 Hz: the first long interval is taken for a pause, the
    next one forgets the 30 Hz pace, and 10 Hz is learnt from it on."""
    a = Anticipation(300e-6, pauses=PAUSE)
    last = stream(a, 0.03)
    assert a.period == pytest.approx(0.03)
    last = stream(a, 0.1, n=2, start=last + 0.1)
    assert a.period is None and a.plan(last + 0.001) is None
    last = stream(a, 0.1, n=KEPT - 2, start=last + 0.1)
    assert a.period is None
    a.arrived(last + 0.1)
    assert a.period == pytest.approx(0.1)


def test_the_window_is_at_most_the_streams_share_of_the_period() -> None:
    a = Anticipation(300e-6)
    last = stream(a, 0.001)  # 1 kHz
    plan = a.plan(last)
    assert plan is not None
    assert plan.spin_until - plan.opens <= MAX_SHARE * 0.001 + 1e-12
    assert not plan.warm  # (the window alone takes the whole share)


@pytest.mark.parametrize(("period", "run_s", "warm"), [
    (1 / 30, 0.0005, True),  # the contention camera: 0.3 + 0.5 ms of 33 ms
    (1 / 30, WARM_MAX_RUN_US / 1e6 + 1e-6, False),  # a run too long to repeat
    (0.01, 0.00019, True),  # 100 Hz: 0.3 + 0.19 ms, under 5 % of 10 ms
    (0.01, 0.00021, False),
    (0.001, 0.0, False),  # 1 kHz: the 50 µs window is the share
])
def test_the_warm_up_only_where_it_fits_the_share_beside_the_window(
        period: float, run_s: float, warm: bool) -> None:
    """What anticipation costs a stream per second is bounded: per request, the window and
    the warm-up's run at most MAX_SHARE of the period (of one core)."""
    a = Anticipation(300e-6)
    last = stream(a, period)
    plan = a.plan(last, run_s)
    assert plan is not None and plan.warm is warm
    assert plan.spin_until - plan.opens + (run_s if warm else 0.0) <= MAX_SHARE * period + 1e-12


def test_without_the_warm_up_the_sleep_is_not_cut_for_it() -> None:
    a = Anticipation(300e-6)
    last = stream(a, 0.01)
    a.warmed(0.0004)
    warmed, cold = a.plan(last, 0.0001), a.plan(last, 0.0009)
    assert warmed is not None and cold is not None
    assert warmed.warm and not cold.warm
    assert cold.wake_at - warmed.wake_at == pytest.approx(0.0004)


def test_too_fast_or_too_slow_a_pace_and_a_zero_window_get_none() -> None:
    for period in (0.0001, 1.0):
        a = Anticipation(300e-6)
        last = stream(a, period)
        assert a.plan(last) is None
    a = Anticipation(0.0)
    last = stream(a, 0.01)
    assert a.plan(last) is None


def test_a_late_request_is_waited_for_on_the_doorbell() -> None:
    a = Anticipation(300e-6)
    last = stream(a, 0.01)
    assert a.plan(last + 0.0101) is not None  # inside the window
    assert a.plan(last + 0.0102) is None  # past it: block
    # Inside the window the wake-up is now (no sleep left).
    plan = a.plan(last + 0.0099)
    assert plan is not None and plan.wake_at == last + 0.0099


def test_the_sleep_ends_earlier_by_the_threads_usual_oversleep_and_warm_up() -> None:
    a = Anticipation(300e-6)
    last = stream(a, 0.01)
    before = a.plan(last)
    assert before is not None
    for late in (80e-6, 60e-6, 70e-6, 5.0):  # a 5 s stall counts as the cap, not more
        a.woke(late)
    after = a.plan(last)
    assert after is not None
    assert before.wake_at - after.wake_at == pytest.approx(a.oversleep)
    assert 60e-6 <= a.oversleep <= 500e-6
    assert after.spin_until == before.spin_until and after.opens == before.opens
    for took in (200e-6, 250e-6, 1.0):  # a warm-up that took 1 s counts as the cap
        a.warmed(took)
    warmed = a.plan(last)
    assert warmed is not None and warmed.opens == before.opens
    assert after.wake_at - warmed.wake_at == pytest.approx(250e-6)


def test_the_wake_up_is_planned_by_the_p90_of_the_oversleeps() -> None:
    """The timed sleep ends early by how late the thread's sleeps ended in nine cases of
    ten, not in half: one late wake-up in twenty does not move the plan, three do, and
    only the last KEPT_OVERSLEEPS count."""
    a = Anticipation(300e-6)
    last = stream(a, 1 / 30)
    base = a.plan(last)
    assert base is not None
    for late in [100e-6] * (KEPT_OVERSLEEPS - 1) + [400e-6]:
        a.woke(late)
    one = a.plan(last)
    assert one is not None and base.wake_at - one.wake_at == pytest.approx(100e-6)
    for late in [300e-6] * 2:
        a.woke(late)
    three = a.plan(last)  # 300, 300, 400 among the last twenty: the p90 is 300
    assert three is not None and base.wake_at - three.wake_at == pytest.approx(300e-6)
    for _ in range(KEPT_OVERSLEEPS):
        a.woke(50e-6)
    assert a.oversleeps == [50e-6] * KEPT_OVERSLEEPS and a.oversleep == pytest.approx(50e-6)
    # The window itself does not move: only when the thread wakes before it.
    assert (one.opens, one.spin_until) == (base.opens, base.spin_until)


def test_the_burst_threads_timer_slack_is_its_own() -> None:
    """low_timer_slack sets the calling thread's slack to 1 ns; other threads keep theirs."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    got: list[int] = []

    def body() -> None:
        got.append(int(low_timer_slack()))
        got.append(int(libc.prctl(30, 0, 0, 0, 0)))  # PR_GET_TIMERSLACK

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert got == [1, 1]
    assert int(libc.prctl(30, 0, 0, 0, 0)) != 1


# --- the thread's side -----------------------------------------------------------------


class Burstish:
    """What await_request needs of a burst: the doorbell, the stop, the header, the
    host's side (its warm-ups counted here)."""

    def __init__(self) -> None:
        self.sock, self.peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.stop = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.buf = bytearray(layout.HEADER)
        layout.init_header(self.buf)
        self.closing = False
        self.burst_id, self.uid = 1, 1001
        self.lock = threading.Lock()
        self.warmed = 0
        self.run_us = 0.0  # (the stream's last run: what a warm-up costs)
        self.counters = BurstCounters()
        self.anticipate = Anticipate(300e-6, self.lock, self._warm)

    def _warm(self, server: object) -> bool:
        assert server is self and self.lock.locked()
        self.warmed += 1
        return True

    def fds(self) -> tuple[int, int]:
        return self.sock.fileno(), self.stop

    def close(self) -> None:
        self.sock.close()
        self.peer.close()
        os.close(self.stop)


@pytest.fixture
def b() -> Iterator[Burstish]:
    x = Burstish()
    try:
        yield x
    finally:
        x.close()


def open_window(a: Anticipation, ahead: float, length: float) -> None:
    """Make ``a`` expect its next request ``ahead`` s from now, with a window ``length``
    long (the period is forty windows, so the window is not capped and a warm-up fits
    beside it)."""
    import time

    period = 40 * length
    a.window_s = length
    a.intervals = [period] * KEPT
    a.period = period
    a.last = time.perf_counter() + ahead - period
    a.recent = [a.last]


def test_a_request_written_in_the_window_is_seen_without_a_ring(b: Burstish) -> None:
    a = Anticipation(0.0)
    open_window(a, 0.0, 60.0)  # open now, for a minute
    layout.write_request_header(b.buf, 1, 10)
    assert await_request(a, b.fds(), b.buf, 0, b) == bc.POLLED
    assert not b.lock.locked() and b.warmed == 1  # warmed up first, under the lock
    c = b.counters  # what it did is counted, with its times in order
    assert c.warms == 1 and c.expired == 0
    assert c.warm0 <= c.warm1 <= c.poll0 and c.due == pytest.approx(a.last + a.period)


def test_a_ring_before_the_window_ends_the_sleep(b: Burstish) -> None:
    a = Anticipation(0.0)
    open_window(a, 60.0, 1.0)  # the window opens in a minute
    b.peer.send(b"\1")
    assert await_request(a, b.fds(), b.buf, 0, b) == bc.EARLY
    b.sock.recv(16)
    os.eventfd_write(b.stop, 1)  # the stop too
    assert await_request(a, b.fds(), b.buf, 0, b) == bc.EARLY
    assert b.warmed == 0 and b.counters.warms == 0  # no window was reached


def test_a_long_sleep_ends_in_two_parts_then_polls(b: Burstish) -> None:
    """A wake-up more than COARSE_S ahead: a coarse sleep, then the rest (whose slack is
    small), then the poll sees the request; a ring during the coarse part ends it."""
    import time

    a = Anticipation(0.0)
    open_window(a, 0.0, 60.0)  # a window open for a minute...
    plan = a.plan(time.perf_counter())
    assert plan is not None
    a.warm_s = a.oversleep = 0.0
    a.last = time.perf_counter() + 4 * COARSE_S - a.period + 0.6 * a.window_s  # ...in 8 ms
    a.recent = [a.last]
    layout.write_request_header(b.buf, 1, 10)
    assert await_request(a, b.fds(), b.buf, 0, b) == bc.POLLED
    c = b.counters
    assert c.wake_at <= c.woke <= c.poll0 and b.warmed == 1
    assert len(a.oversleeps) == 1  # the sleep's lateness was learnt
    # Rung during the coarse part: EARLY, nothing learnt (it did not reach its end).
    a.last = time.perf_counter() + 60.0 - a.period
    a.recent = [a.last]
    b.peer.send(b"\1")
    assert await_request(a, b.fds(), b.buf, 0, b) == bc.EARLY
    assert len(a.oversleeps) == 1 and b.warmed == 1


def test_a_window_without_a_request_falls_back_to_the_doorbell(b: Burstish) -> None:
    a = Anticipation(0.0)
    open_window(a, 0.0, 0.02)
    assert await_request(a, b.fds(), b.buf, 0, b) == bc.LATE
    assert b.counters.expired == 1
    # No pace, or another burst polling: at once.
    assert await_request(Anticipation(300e-6), b.fds(), b.buf, 0, b) == bc.RUNG
    assert b.counters.unplanned == 1
    warmed = b.warmed
    open_window(a, 0.0, 60.0)
    with b.lock:
        assert await_request(a, b.fds(), b.buf, 0, b) == bc.RUNG
    assert b.warmed == warmed  # nor a warm-up while another burst has the lock
    assert b.counters.busy == 1 and b.counters.expired == 1


def test_a_window_is_given_up_for_another_uid_owed_the_turn(b: Burstish) -> None:
    """Another uid's stream was skipped and waits for a window overlapping this one's
    (drivers/poll_turns.py): this burst gives its window up, without the lock or a
    warm-up, and takes the next one once that uid had its turn."""
    import time

    turns = b.anticipate.turns
    a = Anticipation(0.0)
    open_window(a, 0.0, 60.0)
    now = time.perf_counter()
    turns.planned(2, 1002, now - 1.0, now + 120.0)
    turns.owed.add(1002)
    turns.last_turn[b.uid] = now - 2.0  # this uid had the last turn
    layout.write_request_header(b.buf, 1, 10)
    assert await_request(a, b.fds(), b.buf, 0, b) == bc.RUNG
    assert b.counters.deferred == 1 and b.counters.busy == 0 and b.warmed == 0
    assert not b.lock.locked() and 1 not in turns.windows and b.uid in turns.owed
    turns.took(2, time.perf_counter())  # the other uid's turn
    assert await_request(a, b.fds(), b.buf, 0, b) == bc.POLLED
    assert b.counters.deferred == 1 and b.warmed == 1 and b.uid not in turns.owed


def test_a_closing_burst_stops_polling(b: Burstish) -> None:
    a = Anticipation(0.0)
    open_window(a, 0.0, 60.0)
    b.closing = True
    assert await_request(a, b.fds(), b.buf, 0, b) == bc.POLLED
