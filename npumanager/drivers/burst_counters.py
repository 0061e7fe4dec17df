"""What a burst's thread did, counted: how each request was found, and what anticipation
(:mod:`npumanager.drivers.anticipate`) did for it (``device.stats``'s ``"bursts"``).

Without these nobody could tell why anticipation bought nothing in the bench: whether
the poll window caught the requests, how far from their predicted due time they came,
and how long the warm-up ran before them. Each count is a plain integer bumped by the
burst's own thread (one writer; a reader on the event loop sees a value at most one
request old). ``recent`` keeps the last ``KEPT_RECENT`` requests' times
(``time.perf_counter``, CLOCK_MONOTONIC: comparable with a client's own on the same
machine), so a bench can lay them next to its calls: when it rang, when this thread
saw it, when the answer was out.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

#: Requests whose times are kept.
KEPT_RECENT = 2048

#: How a request was found (``recent``'s ``how``).
AHEAD = 0  # in the header before the thread waited (written while it answered the last)
RUNG = 1  # its doorbell woke the thread from a plain wait
POLLED = 2  # the poll window caught it
EARLY = 3  # its doorbell woke the thread from the timed sleep before the window
LATE = 4  # its doorbell woke the thread after a window that ended without it
HOW = ("ahead", "rung", "polled", "early", "late")

_NAN = math.nan


@dataclass(slots=True)
class BurstCounters:
    served: int = 0
    #: Served, by how each was found (indexes as ``HOW``).
    found: list[int] = field(default_factory=lambda: [0] * len(HOW))
    #: Warm-ups run before a window, windows that ended without a request, waits with
    #: anticipation on but no plan (no steady pace learnt yet, or the window was over),
    #: and windows skipped because another burst held the poll.
    warms: int = 0
    expired: int = 0
    unplanned: int = 0
    busy: int = 0
    #: The request being waited for: its predicted due time, when the thread was to wake
    #: from its timed sleep and when it did, the warm-up's start and end, when polling
    #: began (NaN: did not).
    due: float = _NAN
    wake_at: float = _NAN
    woke: float = _NAN
    warm0: float = _NAN
    warm1: float = _NAN
    poll0: float = _NAN
    #: (seen, how, due, woke, warm0, warm1, poll0, answered, run_us, wake_at, seq) per
    #: request (``seq``: the request's sequence number, so a bench pairs each with the
    #: client's call that rang it even when a request was skipped or answered twice).
    recent: deque[tuple[float, ...]] = field(
        default_factory=lambda: deque(maxlen=KEPT_RECENT))

    def waiting(self) -> None:
        """The thread begins to wait for the next request."""
        self.due = self.wake_at = self.woke = self.warm0 = self.warm1 = self.poll0 = _NAN

    def served_one(self, how: int, seen: float, answered: float, run_us: float,
                   seq: int = 0) -> None:
        self.served += 1
        self.found[how] += 1
        self.recent.append((seen, float(how), self.due, self.woke, self.warm0, self.warm1,
                            self.poll0, answered, run_us, self.wake_at, float(seq)))

    def snapshot(self, recent: bool) -> dict[str, Any]:
        """JSON-ready: the counts, the arrival offsets from the predicted due time
        (median and p90, µs; negative: before it), and with ``recent`` every kept
        request's times."""
        kept = list(self.recent)  # (one C call: the burst's thread may append meanwhile)
        offsets = sorted((r[0] - r[2]) * 1e6 for r in kept if not math.isnan(r[2]))
        out: dict[str, Any] = {
            "served": self.served, **dict(zip(HOW, self.found, strict=True)),
            "warms": self.warms, "expired": self.expired, "unplanned": self.unplanned,
            "busy": self.busy, "offsets_n": len(offsets),
            "offset_p50_us": _pct(offsets, 0.5), "offset_p90_us": _pct(offsets, 0.9),
        }
        if recent:
            out["recent"] = [[None if math.isnan(x) else x for x in r] for r in kept]
        return out


def _pct(xs: list[float], q: float) -> float | None:
    return round(xs[min(len(xs) - 1, int(len(xs) * q))], 1) if xs else None
