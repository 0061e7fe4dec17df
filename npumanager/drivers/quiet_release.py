"""A released model freed where no paced foreground frame is near (``quiet_release``).

Freeing a model is native work under the GIL: dropping the reference ONNX Runtime
session of the 32 MiB LLM runs its destructor, 1.6-2.6 ms (``malloc_mmap_threshold_kb``
= 4096 makes each large buffer a mapping of its own, and each is unmapped then: 0.25-0.35
ms with glibc's sliding threshold, which keeps them in the heap). By default the host
does it as the state says, on the event loop with the host's lock held, so a camera frame
that comes meanwhile waits for the GIL (its burst thread) and for the lock. In the loading
phase of bench/contention.py that is once per load (py-spy of the host: the event loop's
largest single GIL hold while models load, bench/trace_loop.py).

With ``quiet_release`` the loop frees it off the lock, when the state's quiet window
(:mod:`.quiet`) would let a background step of ``RELEASE_S`` start: no paced foreground
frame running and none due within the release plus the window; a held release is looked
at again every ``LOOK_S``. A release waits at most ``MAX_WAIT_S`` (a paced stream whose
frames never leave room), then goes at once. With
the window off, or no stream paced, it is freed at once, off the lock.

Off by default: three full same-run pairs of bench/contention.py (``quiet-release`` vs
the defaults, order alternated) put the camera's p99 while a model loads at 4.1 / 3.4 /
3.5 vs 3.3 / 3.6 / 5.2 ms: one ~2 ms hold per load meets few frames, and the GIL's
convoy (bench/README.md, "What the camera's path sleeps on while a model loads") is made of
many other holds.
"""

from __future__ import annotations

from collections.abc import Callable

from npumanager.clock import LoopClock, Timer
from npumanager.drivers.base import PreparedModel

#: What a release is expected to take, s (the LLM's session: 1.6-2.6 ms, above).
RELEASE_S = 0.003
#: The longest a release waits for a quiet moment, s.
MAX_WAIT_S = 0.25
#: A held release is looked at again this often, s: a running frame holds it for up to a
#: period by the window's reckoning, but its end (an event the window hears of) may let
#: it go much sooner, and the gap after a frame is where the release belongs.
LOOK_S = 0.001


class QuietReleases:
    """Models the state released, freed by the event loop when ``hold_end`` allows.

    ``hold_end(now, run_s)``: None when a background step of ``run_s`` may start now,
    else when to look again (the state's quiet window, asked under the host's lock by
    the caller's function)."""

    def __init__(self, clock: LoopClock,
                 hold_end: Callable[[float, float], float | None]) -> None:
        self.clock = clock
        self.hold_end = hold_end
        self._pending: list[tuple[float, PreparedModel]] = []
        self._timer: Timer | None = None
        #: Models freed, and those of them freed at MAX_WAIT_S during a hold.
        self.freed = 0
        self.late = 0

    def add(self, prepared: PreparedModel) -> None:
        """On the loop (the lock may be held): free ``prepared`` at the next quiet moment,
        never before the caller has returned to the loop."""
        now = self.clock.now()
        self._pending.append((now + MAX_WAIT_S, prepared))
        self._arm(now)

    def _arm(self, at: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.clock.call_at(at, self._look)

    def _look(self) -> None:
        self._timer = None
        if not self._pending:
            return
        now = self.clock.now()
        end = self.hold_end(now, RELEASE_S)
        if end is None:
            # One release per quiet moment: the next one looks again once this one has
            # taken its time.
            _, prepared = self._pending.pop(0)
            self.freed += 1
            prepared.release()
        else:
            late = [p for p in self._pending if p[0] <= now]
            self._pending = [p for p in self._pending if p[0] > now]
            for _, prepared in late:
                self.freed += 1
                self.late += 1
                prepared.release()
        if self._pending:
            first = min(p[0] for p in self._pending)
            self._arm(now if end is None else min(end, first, now + LOOK_S))

    def close(self) -> None:
        """Free everything still pending, now."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        pending, self._pending = self._pending, []
        for _, prepared in pending:
            prepared.release()
