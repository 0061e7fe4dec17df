"""The quiet window: no background step starts when it would overlap a paced
foreground frame (pure: time is the caller's ``now``).

A camera submits one execution per frame on its own clock (30 fps: every 33.3
ms). On the reference driver a background step that runs *while* that frame
runs slows the frame even at SCHED_IDLE: the kernel gives the frame's thread
its core at once, but the two cores still share the L3 cache and the memory
bus, and an LLM decode step streams its 32 MiB of weights through them (the
camera's ORT run went from 0.5 to 2.9 ms in its worst 1 % of frames:
bench/contention_diag.py). On an accelerator with one queue and no preemption
inside a kernel it is worse: a background step started just before a frame
delays the frame by the step's whole length.

So the driver learns each foreground stream's pace (the arrivals of one
connection's executions of one model: a stream whose recent intervals agree is
*paced*, its next frame due one period after its last) and, with
``quiet_window_us`` = X > 0:

* while a paced stream's frame runs, no background step starts (for one period at
  most: a frame that outruns its period holds nothing back after it);
* a background step whose expected length (its model's median step time, at
  most half the period) would reach into ``[due - X, due + X]`` does not start
  before the frame has come and gone, or ``due + X`` passed without it (a late
  or stopped stream holds nothing back for longer than X).

* with ``quiet_tail_us`` = T > 0 (off by default: three quick paired runs did not show
  it helping, drivers/classes.py), after a paced frame ends no background step starts
  for T more (the *tail*): the
  frame's end is when the driver answered, and the camera app's thread has yet to wake
  up and take the answer. bench/contention_trace.py (a kernel scheduler trace, 2 vCPUs,
  kernel 6.18: EEVDF, HZ 250, no kernel preemption) found the camera's slowest frames
  there: its thread runnable for 2-4.7 ms after the answer while a SCHED_IDLE background
  step, started the moment the frame ended, held the CPU. SCHED_IDLE is a weight (3
  against 1024) to EEVDF, not a strict priority: a normal thread that is not *eligible*
  (it ran a moment ago: a preemption, a wake-up with negative lag) is passed over for
  an eligible SCHED_IDLE one, which then keeps the CPU until the next tick (4 ms).

Background work keeps the rest of each period: at 30 fps with X = 1 ms, 4 ms
LLM steps and 1.3 ms frames it loses about 6 of every 33 ms (measured: 14-28 %
of the LLM's tokens/s, drivers/classes.py). Work not paced (a voice assistant's
irregular bursts, one-off executions) holds nothing back: there is no due time
to keep clear, and holding background work for every foreground execution
would let a busy foreground app starve it.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable
from dataclasses import dataclass, field

#: Intervals kept per stream; a stream is paced once MIN_INTERVALS of them are known
#: and most of them lie within PACE_TOLERANCE of their median.
KEPT_INTERVALS = 8
MIN_INTERVALS = 3
PACE_TOLERANCE = 0.25
#: Periods a stream is believed for: frames further apart (or a stream that stopped
#: longer ago) are not a pace to keep clear.
MIN_PERIOD_S = 0.002
MAX_PERIOD_S = 0.5


@dataclass(slots=True)
class Pace:
    """One foreground stream's recent arrivals."""

    last: float
    intervals: list[float] = field(default_factory=list)
    #: When the frame that arrived at ``last`` ended (None: not yet, or not known).
    ended: float | None = None
    #: The median interval while the stream is paced, else None.
    period: float | None = None

    def arrived(self, now: float) -> None:
        gap = now - self.last
        self.last = now
        self.ended = None
        iv = self.intervals
        iv.append(gap)
        if len(iv) > KEPT_INTERVALS:
            del iv[0]
        self.period = None
        if len(iv) < MIN_INTERVALS:
            return
        median = sorted(iv)[len(iv) // 2]
        if not MIN_PERIOD_S <= median <= MAX_PERIOD_S:
            return
        agree = sum(1 for x in iv if abs(x - median) <= PACE_TOLERANCE * median)
        if 2 * agree > len(iv):
            self.period = median


class QuietWindow:
    """Foreground streams' paces and the hold they put on background steps."""

    def __init__(self, window_s: float, tail_s: float = 0.0) -> None:
        if window_s <= 0:
            raise ValueError("a quiet window needs a positive width")
        self.window_s = window_s
        #: After a paced frame's end, this long with no background step (0: none).
        self.tail_s = max(0.0, tail_s)
        self.streams: dict[Hashable, Pace] = {}
        #: When the earliest hold ``held`` found since the caller cleared it ends (None:
        #: none with an end; a running frame's hold ends with the frame, an event).
        self.wake_at: float | None = None
        #: Whether ``held`` held a job back since the caller cleared it (the state's
        #: work-conservation check lets background work wait then).
        self.holding = False

    def arrived(self, key: Hashable, now: float) -> None:
        """A foreground execution of stream ``key`` was admitted at ``now``."""
        pace = self.streams.get(key)
        if pace is None:
            # Streams that stopped long ago are forgotten as new ones come (bounded by
            # the connections and models the driver holds anyway).
            for k in [k for k, p in self.streams.items() if now - p.last > 4 * MAX_PERIOD_S]:
                del self.streams[k]
            self.streams[key] = Pace(now)
        else:
            pace.arrived(now)

    def ended(self, key: Hashable, now: float) -> None:
        """A foreground execution of stream ``key`` ended at ``now`` (its answer given):
        the tail, X more with no background step starting, runs from here."""
        pace = self.streams.get(key)
        if pace is not None and pace.ended is None:
            pace.ended = now

    def forget(self, key: Hashable) -> None:
        self.streams.pop(key, None)

    def hold_end(self, now: float, run_s: float, running: Collection[Hashable], *,
                 tail: bool = True) -> float | None:
        """None: a background step expected to take ``run_s`` may start at ``now``.
        Else when the hold ends at the latest: one period after a running frame (in
        ``running``) of a paced stream arrived (its end, an event, ends the hold sooner),
        X after a paced frame's end (the tail; ``tail=False``: not, as for the load hold,
        :mod:`.load_hold`, whose stops are bounded by other rules), or the end of the
        window around a stream's next frame."""
        x = self.window_s
        end: float | None = None
        for key, pace in self.streams.items():
            period = pace.period
            if period is None:
                continue
            if key in running:
                # Held while the frame runs, but no longer than one period from its
                # arrival: a "frame" that outruns its stream's period (one endless job
                # sent once the stream looked paced) would otherwise hold every
                # background step of every uid for as long as it likes.
                frame_end = pace.last + period
                if now < frame_end:
                    end = frame_end if end is None else min(end, frame_end)
                continue
            if tail and pace.ended is not None and now < pace.ended + self.tail_s:
                # The tail: once per frame, from its end.
                tail_end = pace.ended + self.tail_s
                end = tail_end if end is None else min(end, tail_end)
                continue
            due = pace.last + period
            if now >= due + x:
                due += period  # one frame missed (a late frame is not made up for)
                if now >= due + x:
                    continue  # stopped, or not paced any more
            if now + min(run_s, period / 2) >= due - x:
                end = due + x if end is None else min(end, due + x)
        return end

    def next_hold(self, now: float, running: Collection[Hashable]) -> float | None:
        """When the window around a paced stream's next frame opens (``due - X``, at
        least ``now``): from then on even a step of no length is held. None: no stream
        is paced (or every paced one stopped). Streams in ``running`` are left out:
        their frame's end, an event, comes first."""
        x = self.window_s
        at: float | None = None
        for key, pace in self.streams.items():
            period = pace.period
            if period is None or key in running:
                continue
            due = pace.last + period
            if now >= due + x:
                due += period
                if now >= due + x:
                    continue
            opens = max(now, due - x)
            at = opens if at is None else min(at, opens)
        return at

    def period(self) -> float | None:
        """The shortest period among the paced streams (None: none is paced)."""
        periods = [p.period for p in self.streams.values() if p.period is not None]
        return min(periods) if periods else None

    def held(self, now: float, run_s: float, running: Collection[Hashable]) -> bool:
        """Whether a background step expected to take ``run_s`` must not start at ``now``;
        the earliest finite hold end met since ``wake_at`` was last cleared goes there."""
        end = self.hold_end(now, run_s, running)
        if end is None:
            return False
        self.holding = True
        if end != math.inf and (self.wake_at is None or end < self.wake_at):
            self.wake_at = end
        return True

    def paced(self) -> bool:
        """Whether any stream is paced (else nothing is held)."""
        return any(p.period is not None for p in self.streams.values())
