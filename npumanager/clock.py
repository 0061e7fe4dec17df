"""Time as an input. Everything that waits reads a :class:`Clock` passed in.

Production code uses :class:`MonotonicClock` (CLOCK_MONOTONIC, as Android
timestamps work); tests use :class:`npumanager.testing.VirtualClock`.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic timeline."""
        ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    def __repr__(self) -> str:
        return "MonotonicClock()"

