"""Time as an input. Everything that waits reads a clock passed in.

:class:`Clock` only tells the time; :class:`LoopClock` also drives timers and
sleeps, so back-off, polling, debounce windows and deadlines all follow one
clock. Production code uses :class:`MonotonicClock` (CLOCK_MONOTONIC, as
Android timestamps work, on the running event loop); tests use
:class:`npumanager.testing.VirtualClock` and advance time instead of sleeping.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic timeline."""
        ...


class Timer(Protocol):
    def cancel(self) -> None:
        """The callback will not run (a no-op once it has)."""
        ...


class LoopClock(Clock, Protocol):
    """A clock that also runs timers and sleeps on the running event loop."""

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        """Run ``callback`` on the event loop once ``now() >= when`` (never earlier)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock."""
        ...


class _LoopTimer:
    __slots__ = ("_callback", "_clock", "_handle", "_loop", "_when")

    def __init__(self, clock: MonotonicClock, loop: asyncio.AbstractEventLoop, when: float,
                 callback: Callable[[], None]) -> None:
        self._clock, self._loop, self._when, self._callback = clock, loop, when, callback
        self._handle: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        delay = self._when - self._clock.now()
        self._handle = self._loop.call_later(max(0.0, delay), self._fire)

    def _fire(self) -> None:
        if self._clock.now() < self._when:
            # The loop's clock may round early (uvloop ticks in ms): never fire early.
            self._handle = self._loop.call_later(
                self._when - self._clock.now() + 0.0005, self._fire)
            return
        self._handle = None
        self._callback()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    def call_at(self, when: float, callback: Callable[[], None]) -> Timer:
        return _LoopTimer(self, asyncio.get_running_loop(), when, callback)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def __repr__(self) -> str:
        return "MonotonicClock()"


def wake_at(clock: LoopClock, when: float, fut: asyncio.Future[None]) -> Timer:
    """Resolve ``fut`` (if nothing else has) once ``clock`` reaches ``when``: a deadline
    for a wait that something else may end first."""

    def wake() -> None:
        if not fut.done():
            fut.set_result(None)

    return clock.call_at(when, wake)
