"""Per-uid execution rate and latency of one driver host, for `npu top` (``device.stats``),
and, while someone records a trace (``device.trace``), every execution step.

Each finished execution adds (end time, latency) to its uid's bounded window;
a snapshot gives executions per second over the last ``window_s`` and the
p50/p99 latency of those executions. Recording is an append to a deque: cheap
enough for the execute path.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from typing import Any

WINDOW_S = 10.0
MAX_SAMPLES = 4096  # per uid; beyond it the window is the most recent samples
MAX_STEPS = 50_000  # trace ring: a reader that polls once a second keeps up easily
TRACE_LEASE_S = 10.0  # steps are kept this long after the last device.trace poll
#: Steps in one device.trace reply (~110 bytes each in JSON): a reply of every step since
#: the cursor outgrew the 1 MiB frame on a busy device (or after a recording that ended
#: while the ring still held its steps), and `npu trace` then got none, poll after poll
#: ("outgoing frame of 1326599 bytes exceeds 1048576"). The reader asks again while
#: ``more``.
MAX_REPLY_STEPS = 4000


class ExecStats:
    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._by_uid: dict[int, deque[tuple[float, float]]] = {}
        self._totals: dict[int, int] = {}
        #: monotonic time until which steps are recorded (0: nobody is tracing).
        self.trace_until = 0.0
        self._steps: deque[tuple[int, int, float, float, int, int | None, int, int]] = \
            deque(maxlen=MAX_STEPS)
        self._seq = itertools.count(1)

    def step(self, channel: int, start: float, dur: float, uid: int, feature: int | None,
             job: int, index: int) -> None:
        """One execution step (called from worker threads: deque appends are atomic)."""
        self._steps.append((next(self._seq), channel, start, dur, uid, feature, job, index))

    def steps_since(self, cursor: int, now: float | None = None,
                    limit: int = MAX_REPLY_STEPS) -> dict[str, Any]:
        """The first ``limit`` steps after ``cursor``, and whether ``more`` follow (and keep
        recording for TRACE_LEASE_S more seconds)."""
        now = time.monotonic() if now is None else now
        self.trace_until = now + TRACE_LEASE_S
        after = [s for s in list(self._steps) if s[0] > cursor]
        steps = after[:limit]
        return {"cursor": steps[-1][0] if steps else cursor, "clock": "monotonic",
                "more": len(after) > limit,
                "steps": [{"channel": c, "start": st, "dur": d, "uid": u, "feature": f,
                           "job": j, "step": i} for _n, c, st, d, u, f, j, i in steps]}

    def touch(self, uid: int) -> None:
        """Read what ``record`` of ``uid`` writes (a burst's warm-up: drivers/burst_exec.py)."""
        q = self._by_uid.get(uid)
        _ = (q[-1] if q else None, self._totals.get(uid))

    def record(self, uid: int, latency_s: float, now: float | None = None) -> None:
        q = self._by_uid.get(uid)
        if q is None:
            q = self._by_uid[uid] = deque(maxlen=MAX_SAMPLES)
        q.append((time.monotonic() if now is None else now, latency_s))
        self._totals[uid] = self._totals.get(uid, 0) + 1

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        now = time.monotonic() if now is None else now
        cutoff = now - self.window_s
        out: dict[str, Any] = {}
        for uid, q in list(self._by_uid.items()):
            while q and q[0][0] < cutoff:
                q.popleft()
            # A copy first (one C call, under the GIL): burst threads record while this
            # runs, and a generator over the deque itself failed "deque mutated during
            # iteration" for a busy burst (tests/drivers/test_exec_stats.py).
            lat = sorted(x[1] for x in list(q))
            entry: dict[str, Any] = {"executions": self._totals.get(uid, 0),
                                     "per_s": round(len(lat) / self.window_s, 3)}
            if lat:
                entry["p50_ms"] = round(lat[len(lat) // 2] * 1e3, 3)
                entry["p99_ms"] = round(lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1e3, 3)
            out[str(uid)] = entry
        return {"window_s": self.window_s, "uids": out}
