"""The camera's burst thread's sleeps inside slow frames, by the thread that woke it.

Part of bench/contention_trace.py. Its "gil/lock" column covers only a frame whose request
rang the burst thread awake (from the switch-in to the driver's look at the request); with
anticipation (drivers/anticipate.py) most frames ring nobody, and a burst thread that then
waits for the GIL or the host's lock is simply asleep, not runnable. A thread waiting for
the GIL is woken by the one that drops it, so the waker of each sleep names the holder:
a step worker (``npu-bg_N``) there is a lowered thread that held the GIL
(``background_lower``, drivers/lowering.py), the host's main thread its event loop.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

#: Sleeps shorter than this are the thread's own pauses, not a wait worth naming.
MIN_SLEEP_S = 0.0002


def waker_name(tid: int, threads: dict[int, tuple[Any, ...]]) -> str:
    v = threads.get(tid)
    if v is None:
        return "idle/irq" if tid == 0 else "outside"
    name = "main" if v[0] == tid else str(v[4]) if len(v) > 4 else "?"
    return f"{v[1]}:{name}"


def sleeps_by_waker(switches: list[tuple[float, int, int, int, str]],
                    wakes: list[tuple[float, int, int]], burst_tid: int,
                    spans: list[tuple[float, float]], threads: dict[int, tuple[Any, ...]]
                    ) -> dict[str, tuple[int, float]]:
    """Over ``spans`` (a slow frame's start until the driver saw its request): the burst
    thread's sleeps (switched out not runnable) of at least MIN_SLEEP_S, by who woke it:
    name -> (count, seconds within the spans)."""
    outs = sorted(t for t, _cpu, prev, _nxt, st in switches
                  if prev == burst_tid and not st.startswith("R"))
    woke = sorted((t, waker) for t, tid, waker in wakes if tid == burst_tid)
    woke_at = [w[0] for w in woke]
    #: Each sleep: (switched out, woken, waker).
    naps = []
    for t in outs:
        j = bisect.bisect_right(woke_at, t)
        if j < len(woke):
            naps.append((t, woke[j][0], woke[j][1]))
    starts = [n[0] for n in naps]
    out: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for s, e in spans:
        # (a sleep that began before the frame counts for its part within it: the
        # anticipating thread wakes before the frame is due and may block right then)
        i = max(0, bisect.bisect_left(starts, s) - 1)
        while i < len(naps) and naps[i][0] < e:
            t, tw, waker = naps[i]
            i += 1
            d = min(tw, e) - max(t, s)
            if d >= MIN_SLEEP_S:
                cell = out[waker_name(waker, threads)]
                cell[0] += 1
                cell[1] += d
    return {k: (int(v[0]), float(v[1])) for k, v in out.items()}


def print_sleeps(by: dict[str, tuple[int, float]]) -> None:
    if not by:
        return
    print("the burst thread's sleeps in slow frames until the driver saw the request, by "
          "waker (a GIL or lock hand-over names the holder):")
    for k, (n, s) in sorted(by.items(), key=lambda x: -x[1][1]):
        print(f"  {k:28} {n:4d} sleeps, {s * 1e3:7.2f} ms")
