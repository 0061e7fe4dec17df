"""Time as an input. Everything that waits reads a clock passed in.

:class:`Clock` only tells the time; :class:`LoopClock` also drives timers and
sleeps, so back-off, polling, debounce windows and deadlines all follow one
clock. Production code uses :class:`MonotonicClock` (CLOCK_MONOTONIC, as
Android timestamps work, on the running event loop); tests use
:class:`npumanager.testing.VirtualClock` and advance time instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


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


async def wait_first(clock: LoopClock, futures: set[asyncio.Future[Any]], timeout: float
                     ) -> set[asyncio.Future[Any]]:
    """Wait until one of ``futures`` is done or ``timeout`` passes on ``clock``; returns
    the ones that are done (empty on timeout). Nothing is cancelled."""
    loop = asyncio.get_running_loop()
    deadline: asyncio.Future[None] = loop.create_future()
    timer = wake_at(clock, clock.now() + timeout, deadline)
    try:
        await asyncio.wait({*futures, deadline}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
        deadline.cancel()
    return {f for f in futures if f.done()}


async def wait_for(clock: LoopClock, aw: Awaitable[T], timeout: float) -> T:
    """``asyncio.wait_for`` on ``clock``: the result, or TimeoutError once ``timeout`` has
    passed (the awaitable is then cancelled)."""
    task = asyncio.ensure_future(aw)
    try:
        done = await wait_first(clock, {task}, timeout)
    except BaseException:
        task.cancel()
        raise
    if not done:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise TimeoutError(f"not done within {timeout} s")
    return task.result()
