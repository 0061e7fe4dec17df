"""Follow-on poll: a back-to-back BACKGROUND stream's next request finds its burst's
thread awake (``[[driver]] background_follow_us``; :class:`FollowOn` is pure: times are
the caller's; :func:`follow` is the burst thread's side).

An embedder's batch loop rings its next request a few hundred µs after its answer (the
app wakes, reads the outputs, writes the next inputs). Between the two the burst's thread
blocks on the doorbell, so each batch pays a second wake-up on top of the app's own:
``bench/contention_embed_split.py --cpu-marks`` split the lane's batch (0.45 ms) into
ONNX Runtime's run (0.23 ms) and the round trip's two wake-ups. Here, after a BACKGROUND
answer, the thread polls the request header (yielding its CPU at each look, so that the
app, woken onto this CPU by the answer's ring, runs) for as long as the stream's own
recent gaps say its next request takes, and serves it the moment it is written.

Bounds, because the poll is CPU nobody asked for:

* only a stream whose gaps are known: the last ``KEPT`` from an answer to the client's
  next ring (its ``RUNG_AT`` stamp, believed only between the answer and the moment the
  thread saw the request; else the time seen), and only when their median is at most
  the configured window: an app that sleeps between requests (a camera at 30 Hz, a
  voice assistant, an app that stopped) polls nothing once ``KEPT // 2`` of its gaps were
  long;
* the poll is ``MARGIN`` times that median, at most the configured window, and starts
  from the answer: at most one window per answer, so a stream costs at most
  ``window / its time per request`` of a core, and an idle one nothing;
* only BACKGROUND work (the caller's check: a FOREGROUND stream's thread has its own
  anticipation, :mod:`.anticipate`), and only on a host configured for it (off by
  default: the background lane's ``[driver.background]`` is where it is meant to go).

Measured (#15, embed22; bench/README.md "The second host tuned for throughput"): on the lane the
embedder's doorbell-to-thread stage went 0.10 -> 0.06-0.09 ms, its items/s did not move
(its batch is mostly the state's admission and ONNX Runtime's single-threaded run; its
slow tail is the app's own wake-up): an opt-in.
"""

from __future__ import annotations

import os
import struct
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from npumanager.drivers import burst_counters as bc
from npumanager.tensorio.burst import REQ_AT

if TYPE_CHECKING:
    from npumanager.drivers.burst import BurstServer

#: Gaps kept (answer to the next ring); the poll needs all of them known.
KEPT = 8
#: The poll lasts this many times the gaps' median (the app's own time varies: its
#: Python between two calls, a wake-up that came late).
MARGIN = 1.5


@dataclass(slots=True)
class FollowOn:
    """One burst's stream, seen from its answers: how long after each its next request
    came."""

    window_s: float
    #: When the last answer went out (0: none yet, or the stream has not been followed).
    answered: float = 0.0
    gaps: list[float] = field(default_factory=list)

    def answered_at(self, t: float) -> None:
        """An answer went out at ``t`` (its ring just after)."""
        self.answered = t

    def arrived(self, seen: float, rung: float | None) -> None:
        """The next request was seen at ``seen``; its client stamped its ring ``rung``
        (None: no stamp; a stamp outside the answer..seen stretch is not believed)."""
        last = self.answered
        if last <= 0:
            return
        t = rung if rung is not None and last <= rung <= seen else seen
        gaps = self.gaps
        gaps.append(max(0.0, t - last))
        if len(gaps) > KEPT:
            del gaps[0]

    def poll_s(self) -> float:
        """How long to poll after the last answer (0: not at all)."""
        gaps = self.gaps
        if self.window_s <= 0 or len(gaps) < KEPT:
            return 0.0
        median = sorted(gaps)[KEPT // 2]
        if median > self.window_s:
            return 0.0
        return min(self.window_s, MARGIN * median)


_read_seq = struct.Struct("<Q").unpack_from


def follow(fo: FollowOn, buf: Any, last: int, server: BurstServer) -> int:
    """On a burst's thread, after a BACKGROUND answer: poll the header's request number
    until it is no longer ``last``, at most :meth:`FollowOn.poll_s` from the answer.
    ``FOLLOWED``: it came (or the stop); ``RUNG``: no poll (block on the doorbell as
    before); ``LATE``: the poll ended without it (then block)."""
    span = fo.poll_s()
    counters = server.counters
    if span <= 0 or fo.answered <= 0:  # (not after a FOREGROUND answer)
        return bc.RUNG
    clock, read, yield_ = time.perf_counter, _read_seq, os.sched_yield
    until = fo.answered + span
    counters.follows += 1
    while clock() < until:
        if read(buf, REQ_AT)[0] != last or server.closing:
            return bc.FOLLOWED
        # The app was woken by the answer's ring, quite likely onto this CPU: it goes
        # first (sched_yield lets go of the GIL too).
        yield_()
    counters.follow_expired += 1
    return bc.LATE


__all__ = ["KEPT", "MARGIN", "FollowOn", "follow"]
