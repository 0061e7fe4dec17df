"""Anticipation: a burst's thread is awake when its paced stream's next request comes
(:class:`Anticipation` is pure: time is the caller's ``now``; :func:`await_request` is
the burst thread's side).

A camera or an audio loop rings its burst once per frame and the burst's thread
sleeps in between. On this kind of VM each side of that exchange pays for its
sleep twice over: the wake-up itself (~70-80 µs from the doorbell to the thread
running) and the first microseconds after it, when the idle vCPU runs code
several times slower than a busy one (the state's admission: 15 µs hot, ~110
µs after a 20 ms sleep). A stream has a pace, though: once its requests' recent
intervals agree, the next one is due one period after the last. So the thread
sleeps until shortly before that, then polls the request header for a short
window (``burst_anticipate_us``) and serves the request the moment it is
written: no doorbell wake-up, and a vCPU that is already running.

Bounds, because the poll is CPU nobody asked for:

* only a stream whose last ``KEPT`` intervals all lie within ``TOLERANCE`` of their
  median (a stream that stutters, a voice assistant's irregular requests, one-off
  executions: none); with ``pauses`` (``burst_anticipate_pauses``), a pause of ``PAUSE``
  periods or more between two phrases at that pace is not one of the intervals, and the
  phase starts anew after it (a voice assistant's phrases: anticipated from each one's
  second request; each phrase's end costs one window that no request comes in, one
  window per request still);
* only FOREGROUND work (the caller's check: a background stream waits as before);
* what it costs per request, the poll's window and the warm-up's run, is at most
  ``MAX_SHARE`` of the period, so anticipation costs at most that share of one core
  per stream (its cost per second is bounded whatever the pace), and the host lets one
  burst poll at a time, in turns between uids where their windows overlap
  (:mod:`.poll_turns`): the window is cut to the share (30 Hz and 100 Hz: the full 300
  µs; 1 kHz: 50 µs), and the warm-up is left out where the stream's run (``run_s``,
  the last request's) would take the pair past it (30 Hz: runs up to
  ``WARM_MAX_RUN_US``, 1 ms; 100 Hz: up to 0.2 ms; 1 kHz: none);
* the timed sleep before the window ends early by the thread's recent oversleep (a
  timer wake-up on this VM is late by 90-200 µs), planned by its p90, not its median,
  so that the poll runs before the request lands in about nine ticks of ten; the
  thread's timer slack is 1 ns (:func:`low_timer_slack`) and the sleep's last
  ``COARSE_S`` is a sleep of its own, since the kernel lets a select of t end t/1000
  late on top of the slack (33 µs at 30 Hz);
* a window that ends without a request (a late or stopped stream) falls back to
  blocking on the doorbell, as without anticipation.

Where the window lies comes from the client's clock, not this thread's: the client
stamps each request with when it rang (the header's ``RUNG_AT``; CLOCK_MONOTONIC, this
clock). The time this thread *saw* a request carries its own lateness (a wake-up 70-200
µs late, or a poll that began after the request landed), so a pace learnt from it
places the next window by this thread's jitter as well as the stream's. From the stamps
the due time is the earliest phase of the last ``PHASES`` requests one period on
(a stream paced by ticks arrives on time or late, never early), and the window is the
stretch of at most ``burst_anticipate_us`` that held the most of the last
``KEPT_RESIDUALS`` arrivals around their due times, ending after the last of them it
holds (a stream that arrives within 20 µs of its due time polls for little more than
that). A stamp is a hint from the client about its own requests: one after the request
was seen, more than ``MAX_LAG_S`` before it, or not after the previous one is not
believed (the time it was seen stands in), and whatever the stamps say, the poll is
never longer than the configured window nor more often than once per request.

Measured and not kept (tiny and GRU at 30 Hz, 2 vCPUs, same runs against the kept code):
the poll and the client share a CPU (127 of 133 polled requests: the answer's ring
queues the client on the ringing CPU, and both sleep and wake there), so the poll sees a
request only once the client has rung and blocked, 50-60 µs after its ring stamp.
Polling with ``os.sched_yield`` instead of ``time.sleep(0)`` (a timed sleep of its own:
10 µs with the 1 ns slack) left that as it was (p50 328 vs 342 µs tiny, 394 vs 378 GRU);
moving the window's thread off the client's CPU (``sched_setaffinity``) cut it to 17-23
µs and the ring stage from ~70 to ~20 µs, but the client then sleeps on a CPU that goes
idle and its wake-up there costs more than that: p50 357 vs 329 µs tiny, 411 vs 349 GRU
(with a 400 µs client spin: 326 vs 284, 423 vs 350).
"""

from __future__ import annotations

import select
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from npumanager.drivers import burst_counters as bc
from npumanager.drivers.poll_turns import PollTurns
from npumanager.tensorio.burst import REQ_AT

if TYPE_CHECKING:
    from npumanager.drivers.burst import BurstServer
    from npumanager.drivers.host import DriverHost

#: Intervals kept; a stream is anticipated once KEPT of them are known and every one
#: lies within TOLERANCE of their median.
KEPT = 8
TOLERANCE = 0.1
#: Periods anticipated: shorter ones are better served by a client that keeps calling,
#: longer ones are not a stream.
MIN_PERIOD_S = 0.0005
MAX_PERIOD_S = 0.5
#: The window and the warm-up's run together, per request, at most this share of the
#: period: anticipation's CPU per stream at most this share of one core. (0.1 before it
#: was on by default, the window alone; the contention camera at 30 Hz spends 0.3 ms
#: polling and ~0.35 ms warming per 33 ms frame: 2 %.)
MAX_SHARE = 0.05
#: Where the window lies around the due time: this share of it before.
BEFORE = 0.6
#: Oversleeps kept (their ``LATE_QUANTILE`` is subtracted from the next timed sleep), and
#: the most subtracted. The median left the poll starting after half the requests had
#: landed (measured: the poll began 132 µs after the call, p50, tiny model at 30 Hz).
KEPT_OVERSLEEPS = 20
LATE_QUANTILE = 0.9
MAX_OVERSLEEP_S = 0.0005
#: A timed sleep longer than this ends in two: until this long before the wake-up, then
#: the rest (a select's slack is a thousandth of its timeout: this keeps it at 2 µs).
#: Measured on this VM, 33 ms sleeps, lateness p50/p90: one select 198/242 µs, with the
#: slack at 1 ns 176/198, in two parts 89/131.
COARSE_S = 0.002
#: Streams whose run took longer than this (µs) are not warmed up before their request.
WARM_MAX_RUN_US = 1000.0
#: The most a warm-up is planned for (a longer one is the caller's to skip).
MAX_WARM_S = 0.001
#: A client's stamp is believed when it lies at most this long before the request was seen.
MAX_LAG_S = 0.1
#: The due time is the earliest of the last PHASES arrivals' phases, one period on each.
PHASES = 4
#: Arrivals' offsets from their due times kept; the window is placed by them once there
#: are MIN_RESIDUALS (before: around the due time, ``BEFORE``). Offsets beyond half a
#: period (a skipped frame) are not kept.
KEPT_RESIDUALS = 20
MIN_RESIDUALS = 8
#: The window opens this share of it before the earliest arrival it is placed to hold, and
#: ends this share after the last (the poll's own start is not instant).
MARGIN = 0.1
#: An interval at least this many times the pace's (the kept intervals' median) is a pause
#: between two phrases of one stream, where the burst's ``pauses`` is on (voice30): a
#: voice assistant's 8 requests 30 ms apart, then half a second of silence, never had
#: KEPT intervals that agreed, so none of its requests was anticipated. 3: a camera that
#: drops a frame (twice its period) still breaks its pace, as before.
PAUSE = 3.0


@dataclass(slots=True)
class Plan:
    """Sleep (woken by the doorbell) until ``wake_at``, warm up (``warm``), then poll
    until ``spin_until`` (the window opens at ``opens``)."""

    wake_at: float
    opens: float
    spin_until: float
    #: When the request is due (the window's place around it: ``BEFORE``).
    due: float
    #: Whether the warm-up fits the stream's share (``MAX_SHARE``) beside the window.
    warm: bool = True


@dataclass(slots=True)
class Anticipation:
    """One burst's stream: its arrivals, its pace and the thread's oversleep."""

    window_s: float
    last: float | None = None
    #: The last PHASES arrivals (the newest last), and how far the arrivals came from
    #: their due times (arrival - due, s) while a pace was known.
    recent: list[float] = field(default_factory=list)
    residuals: list[float] = field(default_factory=list)
    #: Arrivals whose client stamp was believed / not (the time seen stood in).
    stamped: int = 0
    unstamped: int = 0
    intervals: list[float] = field(default_factory=list)
    #: The median interval while every kept interval agrees with it, else None.
    period: float | None = None
    oversleeps: list[float] = field(default_factory=list)
    oversleep: float = 0.0
    #: How long the warm-up before the window took, the last few times (median).
    warms: list[float] = field(default_factory=list)
    warm_s: float = 0.0
    #: An interval this many times the kept ones' median is a pause between phrases
    #: (``PAUSE``; 0: every interval counts, as before voice30), and whether the last
    #: one was.
    pauses: float = 0.0
    paused: bool = False

    def arrived(self, now: float, stamp: float | None = None) -> None:
        """A new request was seen at ``now``; its client stamped it ``stamp`` (None: no
        stamp; one that cannot be true is not believed: the time seen stands in)."""
        last = self.last
        if (stamp is not None and now - MAX_LAG_S <= stamp <= now
                and (last is None or stamp > last)):
            t = stamp
            self.stamped += 1
        else:
            t = now
            self.unstamped += 1
        due = self.due()
        if due is not None:
            period = self.period
            assert period is not None
            off = t - due
            if -0.5 * period < off < 0.5 * period:
                _kept_quantile(self.residuals, off, KEPT_RESIDUALS, 0.5)
        self.last = t
        recent = self.recent
        iv = self.intervals
        if (self.pauses and last is not None and iv
                and t - last > self.pauses * sorted(iv)[(len(iv) - 1) // 2]):
            # (Against the lower median of the kept intervals: where half of them are
            # already pauses, a stream that pauses after every second request, the
            # upper one would be a pause and hide the next.)
            if not self.paused:
                # A pause between two phrases of a stream at one pace (a voice
                # assistant's frames, 30 ms apart, then silence): not an interval of the
                # pace, which the next phrase goes on with. Its phase starts anew here.
                self.paused = True
                recent[:] = [t]
                return
            # Two in a row: a slower pace, learnt anew from this interval on.
            iv.clear()
        self.paused = False
        recent.append(t)
        if len(recent) > PHASES:
            del recent[0]
        if last is None:
            return
        iv.append(t - last)
        if len(iv) > KEPT:
            del iv[0]
        self.period = None
        if len(iv) < KEPT:
            return
        median = sorted(iv)[KEPT // 2]
        if not MIN_PERIOD_S <= median <= MAX_PERIOD_S:
            return
        slack = TOLERANCE * median
        if all(abs(x - median) <= slack for x in iv):
            self.period = median

    def woke(self, late_s: float) -> None:
        """A timed sleep ended ``late_s`` after it was asked to (negative: early)."""
        self.oversleep = _kept_quantile(self.oversleeps, min(max(late_s, 0.0), MAX_OVERSLEEP_S),
                                        KEPT_OVERSLEEPS, LATE_QUANTILE)

    def warmed(self, took_s: float) -> None:
        """The warm-up before the window took ``took_s``: the next one starts that much
        earlier (at most ``MAX_WARM_S``)."""
        self.warm_s = _kept_median(self.warms, min(max(took_s, 0.0), MAX_WARM_S))

    def due(self) -> float | None:
        """When the next request is due (None: no pace): the earliest phase of the last
        ``PHASES`` arrivals, each one period on per request since."""
        period, recent = self.period, self.recent
        if period is None or not recent:
            return None
        n = len(recent)
        return min(t + (n - i) * period for i, t in enumerate(recent))

    def plan(self, now: float, run_s: float = 0.0) -> Plan | None:
        """When to wake and how long to poll for the next request, or None: block on the
        doorbell (no pace, or its window is already over). ``run_s``: what a warm-up
        would cost (the stream's last run); planned only where it fits the stream's
        share beside the window (``MAX_SHARE``)."""
        period, due = self.period, self.due()
        if period is None or due is None or self.window_s <= 0:
            return None
        budget = MAX_SHARE * period
        window = min(self.window_s, budget)
        warm = run_s <= WARM_MAX_RUN_US / 1e6 and window + run_s < budget
        if len(self.residuals) >= MIN_RESIDUALS:
            first, last = _densest(sorted(self.residuals), (1 - 2 * MARGIN) * window)
            start = due + first - MARGIN * window
            end = min(start + window, due + last + MARGIN * window)
        else:
            start = due - BEFORE * window
            end = start + window
        if now >= end:
            return None  # the request is late: the doorbell wakes the thread
        return Plan(max(now, start - self.oversleep - (self.warm_s if warm else 0.0)), start,
                    end, due, warm)


def _densest(xs: list[float], width: float) -> tuple[float, float]:
    """The stretch at most ``width`` long that holds the most of ``xs`` (sorted; the
    earliest such): its first and last value."""
    best, at, j = 0, 0, 0
    for i, x in enumerate(xs):
        j = max(j, i)
        while j + 1 < len(xs) and xs[j + 1] - x <= width:
            j += 1
        if j - i + 1 > best:
            best, at = j - i + 1, i
    return xs[at], xs[at + best - 1]


def _kept_median(kept: list[float], x: float) -> float:
    return _kept_quantile(kept, x, KEPT_WARMS, 0.5)


#: Warm-up times kept (their median is planned for).
KEPT_WARMS = 8


def _kept_quantile(kept: list[float], x: float, most: int, q: float) -> float:
    kept.append(x)
    if len(kept) > most:
        del kept[0]
    return sorted(kept)[min(len(kept) - 1, int(len(kept) * q))]


_PR_SET_TIMERSLACK = 29


def low_timer_slack() -> bool:
    """The calling thread's timer slack to 1 ns (Linux's default is 50 µs: a timed sleep
    may end that much late so that the kernel can batch wake-ups). Per thread: only an
    anticipating burst's thread asks for it. False: not Linux, or refused."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(1), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


# --- the burst thread's side (the shell: real time, the header, the doorbell) -----------

_read_seq = struct.Struct("<Q").unpack_from


@dataclass(slots=True)
class Anticipate:
    """The host's side: the window, the lock held by the one burst that warms up and
    polls at a time, the warm-up (:func:`warm`), and whose turn the lock is where two
    uids' windows overlap (:mod:`.poll_turns`, used under ``guard``)."""

    window_s: float
    polling: threading.Lock
    warm: Callable[[BurstServer], bool]
    turns: PollTurns = field(default_factory=PollTurns)
    guard: threading.Lock = field(default_factory=threading.Lock)
    #: Each stream's ``Anticipation.pauses`` (``burst_anticipate_pauses``: PAUSE, or 0).
    pauses: float = 0.0

    def take(self, server: BurstServer, now: float) -> bool:
        """Whether ``server``'s stream takes the poll now (then it holds ``polling``):
        not while another burst holds it (``busy``) or where another uid is owed this
        turn (``deferred``); both counted."""
        with self.guard:
            key = server.burst_id
            if not self.turns.ask(key, now):
                server.counters.deferred += 1
                return False
            if not self.polling.acquire(blocking=False):
                self.turns.skipped(key)
                server.counters.busy += 1
                return False
            self.turns.took(key, now)
            return True


def await_request(pace: Anticipation, fds: tuple[int, int], buf: Any, last: int,
                  server: BurstServer) -> int:
    """On a burst's thread: sleep (woken by ``fds``: the doorbell, the stop) until
    shortly before the stream's next request is due, warm up (:func:`warm`), then poll
    the header's request number until it is no longer ``last``. How it ended
    (:mod:`.burst_counters`): ``POLLED`` (the window saw a request, or the stop),
    ``EARLY`` (rung during the sleep: an early request, a hang-up, the stop), ``LATE``
    (nothing within the window) or ``RUNG`` (no window): the last two block on the
    doorbell. What it did goes to ``server.counters``."""
    clock = time.perf_counter
    counters = server.counters
    plan = pace.plan(clock(), server.run_us / 1e6)
    if plan is None or max(fds) >= 1024:  # (select's limit; poll sleeps whole ms)
        counters.unplanned += 1
        return bc.RUNG
    counters.due, counters.wake_at = plan.due, plan.wake_at
    counters.opens, counters.until = plan.opens, plan.spin_until
    side = server.anticipate
    assert side is not None
    with side.guard:
        side.turns.planned(server.burst_id, server.uid, plan.wake_at, plan.spin_until)
    how = bc.RUNG
    try:
        how = _sleep_then_poll(plan, pace, fds, buf, last, server, side)
        return how
    finally:
        with side.guard:
            side.turns.ended(server.burst_id, served_early=how == bc.EARLY)


def _sleep_then_poll(plan: Plan, pace: Anticipation, fds: tuple[int, int], buf: Any,
                     last: int, server: BurstServer, side: Anticipate) -> int:
    """:func:`await_request` once its window is planned (and declared to the turns)."""
    clock = time.perf_counter
    counters = server.counters
    wait = plan.wake_at - clock()
    if wait > COARSE_S:
        # Most of the sleep first; its end may be late by a thousandth of it.
        if select.select(fds, [], [], wait - COARSE_S)[0]:
            counters.woke = clock()
            return bc.EARLY
        wait = plan.wake_at - clock()
        if wait <= 0:  # the first part overslept the wake-up itself: learnt as such
            counters.woke = woke = clock()
            pace.woke(woke - plan.wake_at)
    if wait > 0:
        rung = select.select(fds, [], [], wait)[0]
        counters.woke = woke = clock()
        if rung:
            # Rung after the sleep was to end: it oversleeps at least that much. Learnt
            # here too, or a thread whose every sleep is cut short by the request it
            # overslept would never learn to wake earlier (measured: every request of a
            # 30 Hz stream came during the sleep; a timed sleep here ends 130-190 µs late).
            if woke > plan.wake_at:
                pace.woke(woke - plan.wake_at)
            return bc.EARLY
        pace.woke(woke - plan.wake_at)
    polling = side.polling
    if not side.take(server, clock()):
        # Another burst warms or polls now, or another uid is owed this turn: this one
        # waits for its doorbell.
        return bc.RUNG
    try:
        counters.warm0 = t = clock()
        if plan.warm:
            if side.warm(server):
                counters.warms += 1
            counters.warm1 = t1 = clock()
            pace.warmed(t1 - t)
        read, until, nap = _read_seq, plan.spin_until, time.sleep
        counters.poll0 = clock()
        while clock() < until:
            if read(buf, REQ_AT)[0] != last or server.closing:
                return bc.POLLED
            nap(0)  # (the host's other threads may take the GIL meanwhile)
    finally:
        polling.release()
    counters.expired += 1
    return bc.LATE


def warm(host: DriverHost, server: BurstServer) -> bool:
    """A FOREGROUND stream's next request is due: its kept request's bound run once more,
    into outputs of its own, so that the code and the memory the request's run touches
    are in the caches when it comes (on this VM a tiny model's run paced at 30 Hz takes
    ~200 µs, ~40 µs when the same run went 0.5 ms before). Only for runs that took at
    most ``WARM_MAX_RUN_US``, under the host's lock (the model cannot be released under
    it); the state never hears of it. True: it ran."""
    if server.run_us > WARM_MAX_RUN_US:
        return False
    with host.lock:
        fixed = server.fixed
        if (fixed is None or fixed.run is None or server.closing
                or not fixed.still_valid(server.client.pools,
                                         host.res.prepared.get(server.model_id))):
            return False
        run = fixed.warm_run
        if run is None:
            bind = getattr(fixed.prepared, "bind", None)
            scratch = {name: np.empty_like(v) for name, (v, _) in fixed.bound.items()}
            run = fixed.warm_run = (bind(fixed.inputs, scratch) if bind else None) or _idle
        try:
            run()
        except Exception:
            fixed.warm_run = _idle  # (a run that fails warms nothing; the real one tells)
            return False
        # The bookkeeping around the run too (the same path, writing nothing).
        if host.bursts.rehearse(server):
            server.counters.rehearsed += 1
        return run is not _idle


def _idle() -> dict[str, Any]:
    return {}
