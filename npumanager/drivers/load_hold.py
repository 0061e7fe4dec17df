"""The quiet window for background loads: the compile child stopped around paced
foreground frames (pure: time is the caller's ``now``).

A background model's compile runs in a lowered child process
(:mod:`.compile_worker`). SCHED_IDLE gives a camera frame the core at once, but
not the cache or the memory bus: ONNX Runtime optimizing a 32 MiB model streams
its weights through the L3 the frame's own run needs, and the loading phase of
bench/contention.py had the camera's p99 at 1.7-2.8x the camera alone with its
slowest frames spread over the whole load (no single stage of it). The quiet
window (:mod:`.quiet`) already keeps background *steps* clear of the camera's
frames; a compile is one long piece of work with no step boundaries, so the
driver stops the child instead (SIGSTOP, SIGCONT: ``HoldLoads``) while a
background prepare is in flight:

* it is stopped when even a step of no length would be held (a paced stream's
  frame is due within X, or one runs), and continued once that hold ends (the
  frame ended, or ``due + X`` passed without it);
* bounded, so a foreground stream cannot hold a load forever, whatever its pace
  and however long its frames run: one stop lasts at most one period of the
  fastest paced stream, and after a stop the child runs at least as long as it
  was stopped before it can be stopped again (so it keeps at least half of the
  time of any load; at 30 fps with 1 ms frames and X = 1 ms it loses about
  3 ms of every 33).

A foreground app of one uid does make another uid's compile wait: that is the
point, and it is the same priority the run queue already gives its steps; the
bound above is what keeps it from being a denial of service
(tests/security/test_load_hold.py).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable
from typing import TYPE_CHECKING

from npumanager.drivers import events as ev
from npumanager.drivers.quiet import QuietWindow

if TYPE_CHECKING:
    from npumanager.drivers.classes import ExecClass
    from npumanager.drivers.records import PrepareRecord
    from npumanager.drivers.runqueue import RunQueue

#: The state's timer key for looking at the hold again.
LOAD_TIMER = "load-hold"


class LoadHold:
    """When the compile child is stopped; counts for ``npu status`` and tests."""

    def __init__(self, quiet: QuietWindow) -> None:
        self.quiet = quiet
        #: When the current stop began (None: the child runs).
        self.stopped_at: float | None = None
        #: The longest the current stop may last (one period when it began).
        self.max_stop_s = 0.0
        #: Not stopped again before this (the child runs as long as its last stop).
        self.free_at = -math.inf
        self.stops = 0
        self.stopped_s = 0.0  # all stops together
        self.longest_s = 0.0

    def decide(self, now: float, loading: bool, running: Collection[Hashable]
               ) -> tuple[bool | None, float | None]:
        """(change, next_at): True: stop the child now, False: continue it now, None:
        leave it; ``next_at``: when to decide again at the latest (None: not before
        the next event). ``loading``: a background prepare is in flight; ``running``:
        the foreground streams running or queued now (as for :meth:`QuietWindow.held`)."""
        quiet = self.quiet
        if self.stopped_at is not None:
            cap = self.stopped_at + self.max_stop_s
            end = quiet.hold_end(now, 0.0, running, tail=False) if loading and now < cap else None
            if end is not None:
                return None, min(end, cap)
            took = now - self.stopped_at
            self.stopped_at = None
            self.stopped_s += took
            self.longest_s = max(self.longest_s, took)
            self.free_at = now + took
            return False, (max(self.free_at, now) if loading and quiet.paced() else None)
        if not loading:
            return None, None
        if now < self.free_at:
            return None, self.free_at if quiet.paced() else None
        end = quiet.hold_end(now, 0.0, running, tail=False)
        if end is None:
            return None, quiet.next_hold(now, running)
        self.stopped_at = now
        self.max_stop_s = quiet.period() or (end - now)
        self.stops += 1
        return True, min(end, now + self.max_stop_s)


class LoadHoldRules:
    """DriverState's part: one decision after every event (cheap when nothing loads)."""

    if TYPE_CHECKING:  # DriverState's, declared for the type checker
        _queue: RunQueue
        _out: list[ev.Instruction]
        _prepares: dict[int, PrepareRecord]

        def model_class(self, uid: int) -> ExecClass: ...

    load_hold: LoadHold | None = None
    _load_at: float | None = None

    def _sync_load_hold(self, now: float) -> None:
        hold = self.load_hold
        assert hold is not None
        if not self._prepares and hold.stopped_at is None:
            return
        loading = any(p.background for p in self._prepares.values())
        running = self._queue.foreground_streams() if loading else ()
        change, at = hold.decide(now, loading, running)
        if change is not None:
            self._out.append(ev.HoldLoads(change))
        if at is not None and at > now and at != self._load_at:
            self._load_at = at
            self._out.append(ev.ArmTimer(LOAD_TIMER, at))
