"""A virtual clock for deterministic tests (trio's MockClock, simplified)."""

from __future__ import annotations


class VirtualClock:
    """A clock that moves only when told. ``advance`` never goes backwards."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError("a clock does not go backwards")
        self._now += seconds
        return self._now

    def __repr__(self) -> str:
        return f"VirtualClock(now={self._now:.3f})"
