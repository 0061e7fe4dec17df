"""A virtual clock for deterministic tests (trio's MockClock, simplified).

Time moves only when a test calls :meth:`VirtualClock.advance`; timers armed
with :meth:`~VirtualClock.call_at` and sleepers in :meth:`~VirtualClock.sleep`
come due in time order as it does. A timer armed from an event loop fires on
that loop's thread (through ``call_soon_threadsafe`` when the test advances
time from another thread), so a daemon or driver host running on a virtual
clock is driven without a single wall-clock sleep.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
from collections.abc import Callable


class _VirtualTimer:
    __slots__ = ("callback", "cancelled", "loop", "when")

    def __init__(self, when: float, callback: Callable[[], None],
                 loop: asyncio.AbstractEventLoop | None) -> None:
        self.when, self.callback, self.loop = when, callback, loop
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """A clock that moves only when told. ``advance`` never goes backwards."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, _VirtualTimer]] = []
        self._seq = itertools.count()
        self._lock = threading.Lock()

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, callback: Callable[[], None]) -> _VirtualTimer:
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        timer = _VirtualTimer(when, callback, loop)
        with self._lock:
            heapq.heappush(self._timers, (when, next(self._seq), timer))
        return timer

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        timer = self.call_at(self._now + seconds, wake)
        try:
            await fut
        finally:
            timer.cancel()

    def advance(self, seconds: float) -> float:
        """Move time forward, running every timer that comes due, in time order."""
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        end = self._now + seconds
        while True:
            with self._lock:
                if not self._timers or self._timers[0][0] > end:
                    break
                when, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, when)
            self._run(timer)
        self._now = end
        return self._now

    def next_timer(self) -> float | None:
        """When the earliest live timer is due (None: none armed)."""
        with self._lock:
            live = [w for w, _, t in self._timers if not t.cancelled]
        return min(live) if live else None

    @staticmethod
    def _run(timer: _VirtualTimer) -> None:
        loop = timer.loop
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if loop is None or loop is here:
            timer.callback()
        elif not loop.is_closed():
            loop.call_soon_threadsafe(timer.callback)

    def __repr__(self) -> str:
        return f"VirtualClock(now={self._now:.3f})"
