"""Debouncing of the work lifecycle per uid, as AOSP's NPU HAL does it (pure, no I/O).

A uid's work forms a burst: the burst's first work item reports requested and
started; its end is reported once, one debounce window after its last work
ended, with that work's info and reason. Work the uid submits inside the
window continues the burst: its requested/started are not reported and the
pending end is dropped (a later end replaces it). With a window of 0 every
work item reports its own end at once.
"""

from __future__ import annotations

from dataclasses import dataclass

from npumanager.hal.types import EndReason, WorkInfo


@dataclass(slots=True)
class _Burst:
    active: int = 0
    #: The burst's end, reported at ``deadline`` unless the uid submits work before.
    pending: tuple[WorkInfo, EndReason, float] | None = None


class Debouncer:
    def __init__(self, window_ms: int) -> None:
        self.window_s = max(0, window_ms) / 1000.0
        self._bursts: dict[int, _Burst] = {}
        #: Bursts with an end pending: ``next_deadline`` is asked after every event, and
        #: most find none (a stream's pending end is dropped when its next work begins).
        self._pending = 0

    def __repr__(self) -> str:
        pending = sum(1 for b in self._bursts.values() if b.pending is not None)
        return f"<Debouncer {self.window_s * 1000:.0f} ms: {pending} ends pending>"

    def set_window(self, window_ms: int) -> None:
        self.window_s = max(0, window_ms) / 1000.0

    def begin(self, uid: int) -> bool:
        """Work of ``uid`` was admitted. False: it continues a debouncing burst, so its
        requested/started are not reported."""
        burst = self._bursts.get(uid)
        if burst is None:
            burst = self._bursts[uid] = _Burst()
        continues = burst.pending is not None
        if continues:
            burst.pending = None
            self._pending -= 1
        burst.active += 1
        return not continues

    def continues(self, uid: int) -> bool:
        """Whether work of ``uid`` admitted now would continue a debouncing burst (its
        end pending): ``begin`` would return False."""
        burst = self._bursts.get(uid)
        return burst is not None and burst.pending is not None

    def end(self, uid: int, info: WorkInfo, reason: EndReason, now: float,
            listening: bool) -> bool:
        """Work of ``uid`` ended. True: report its end now (window 0: every work item
        reports its own end); else the burst's end is pending (this was its last work)
        or this end is folded into the burst (other work of the uid is still live)."""
        burst = self._bursts[uid]
        burst.active -= 1
        if not listening or self.window_s <= 0:
            if burst.active <= 0:
                del self._bursts[uid]
            return listening
        if burst.active <= 0:
            self._pending += 1  # (active work has no end pending: see check)
            burst.pending = (info, reason, now + self.window_s)
        return False

    def due(self, now: float) -> list[tuple[WorkInfo, EndReason]]:
        """The burst ends whose window has passed, earliest first (they leave)."""
        out: list[tuple[float, WorkInfo, EndReason]] = []
        for uid, burst in list(self._bursts.items()):
            p = burst.pending
            if p is not None and p[2] <= now:
                out.append((p[2], p[0], p[1]))
                del self._bursts[uid]  # active is 0 while an end is pending
                self._pending -= 1
        out.sort(key=lambda e: e[0])
        return [(info, reason) for _, info, reason in out]

    def drop_pending(self) -> None:
        """Nobody listens any more: pending ends are not reported to a later listener."""
        for uid, burst in list(self._bursts.items()):
            if burst.pending is not None:
                del self._bursts[uid]
        self._pending = 0

    def next_deadline(self) -> float | None:
        if not self._pending:
            return None
        ds = [b.pending[2] for b in self._bursts.values() if b.pending is not None]
        return min(ds) if ds else None

    def active(self, uid: int) -> int:
        burst = self._bursts.get(uid)
        return 0 if burst is None else burst.active

    def check(self, active_by_uid: dict[int, int]) -> None:
        """Invariants: the burst counts match the live work per uid."""
        counts = {uid: b.active for uid, b in self._bursts.items() if b.active}
        assert counts == active_by_uid, f"burst counts {counts} != live work {active_by_uid}"
        for uid, b in self._bursts.items():
            assert b.active >= 0, uid
            assert b.pending is None or b.active == 0, f"uid {uid}: end pending while active"
        pending = sum(1 for b in self._bursts.values() if b.pending is not None)
        assert self._pending == pending, f"{self._pending} ends counted, {pending} pending"
