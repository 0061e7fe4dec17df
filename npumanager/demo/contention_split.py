"""Where a managed camera frame's time went (bench/contention.py ``--frame-split``).

A frame's latency at the camera app is one burst execution. The driver keeps, per
burst, its last requests' records (``device.stats`` ``recent``,
:mod:`npumanager.drivers.burst_counters`): the client's own stamps (when
``execute`` was called, when it rang) and the burst thread's times (when it saw
the request, when it answered) with the serve split into stages. Each frame the
app reported is paired with the record of its request by the ``called`` stamp
(both CLOCK_MONOTONIC, in the app's process and the driver's), and split into:

- ``call>rung``: the client placing its request and ringing;
- ``rung>seen``: the ring to the burst thread seeing the request (its wake-up, or
  the anticipation's poll);
- ``served``: seen to answered, and within it the stages (``run`` is ONNX
  Runtime's run; ``admit`` the state's admission; ...);
- ``back``: the answer to the app's call returning (its wake-up, the copy of the
  outputs).

:func:`split` is pure (the frames and records are the caller's);
:class:`SplitRun` is a :class:`~npumanager.demo.contention.ContentionRun` that
fetches the records after each phase (one admin call, after the phase's window)
and adds the split to its result.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import math
import os
import threading
import time
from typing import Any

from npumanager.constants import ModelPriority
from npumanager.demo import contention_probe
from npumanager.demo.contention import UIDS, ContentionRun, RunResult
from npumanager.drivers.burst_counters import STAGES
from npumanager.paths import BACKGROUND_LANE, lane_socket

#: Where a record's fields lie (drivers/burst_counters.py ``recent``).
_SEEN, _ANSWERED, _RUN_US, _FIRST = 0, 7, 8, 11
#: The parts of a frame, in order, then each stage's wall time.
PARTS = ("call>rung", "rung>seen", "served", "back")
COLUMNS = ("ms", *PARTS, *STAGES)
#: A frame's call began at most this long before its end minus its latency (the app
#: reports the time it emitted the frame, a little after the call returned).
_SLACK_S = 0.002


def split(frames: list[tuple[float, float]], records: list[list[float | None]]
          ) -> list[dict[str, float]]:
    """Each frame ``(t, ms)`` (``t``: CLOCK_MONOTONIC when the app reported it, just
    after its call returned; ``ms``: its latency) whose request is among ``records``:
    its latency and parts, ms. Frames without a record are left out."""
    def f(x: float | None) -> float:
        return math.nan if x is None else float(x)

    recs = sorted((f(r[-2]), r) for r in records if r and r[-2] is not None)
    called = [c for c, _ in recs]
    out: list[dict[str, float]] = []
    for t, ms in frames:
        lo = t - ms / 1e3 - _SLACK_S
        i = bisect.bisect_left(called, lo)
        if i >= len(called) or called[i] > t:
            continue
        c, r = recs[i]
        seen, answered, rung = f(r[_SEEN]), f(r[_ANSWERED]), f(r[-1])
        row = {"ms": ms, "call>rung": (rung - c) * 1e3, "rung>seen": (seen - rung) * 1e3,
               "served": (answered - seen) * 1e3,
               "back": ms - (answered - c) * 1e3}
        n_stages = len(r) - _FIRST - 4  # (the tail: opens, until, called, rung)
        for k, name in enumerate(STAGES):
            row[name] = f(r[_FIRST + k]) / 1e3 if k < n_stages else math.nan
        out.append(row)
    return out


def in_window(frames: list[tuple[float, float]], start: float, end: float,
              records: list[list[float | None]]) -> list[tuple[float, float]]:
    """The frames ``(t, ms)`` reported in ``[start, end)`` that the split must pair: those
    called up to the last call ``records`` hold. The host keeps a request's record only after
    it has answered it (and yielded to the client), so a frame the app reported just before
    the records were fetched may have none yet (17 paired of 18 in a full run beside other
    work); the burst serves its requests in order, so every frame called up to the last
    recorded call has its record, and the tail after it is not the split's to pair."""
    last = max((float(c) for r in records if r and (c := r[-2]) is not None and c == c),
               default=math.inf)
    return [(t, ms) for t, ms in frames
            if start <= t < end and t - ms / 1e3 - _SLACK_S <= last]


def summarize(rows: list[dict[str, float]], q: float = 0.95, worst: int = 3
              ) -> dict[str, Any]:
    """The median of each column over all frames and over the frames at or above the
    ``q`` latency quantile, and the ``worst`` frames whole."""
    if not rows:
        return {}

    def med(sel: list[dict[str, float]], k: str) -> float:
        xs = sorted(v for r in sel if not math.isnan(v := r[k]))
        return xs[len(xs) // 2] if xs else math.nan

    by_ms = sorted(rows, key=lambda r: r["ms"])
    slow = by_ms[min(len(by_ms) - 1, int(q * len(by_ms))):]
    return {"n": len(rows), "n_slow": len(slow),
            "all": {k: med(rows, k) for k in COLUMNS},
            "slow": {k: med(slow, k) for k in COLUMNS},
            "worst": [{k: r[k] for k in COLUMNS} for r in by_ms[::-1][:worst]]}


def camera_records(stats: dict[str, Any], uid: int | None) -> list[list[float | None]]:
    """The camera's burst records in a driver's ``device.stats``: its uid's bursts
    (``uid`` None: every foreground burst, the apps sharing one uid)."""
    out: list[list[float | None]] = []
    for b in stats.get("bursts") or []:
        if (b.get("uid") == uid) if uid is not None else b.get("foreground"):
            out += b.get("recent") or []
    return out


def format_split(name: str, phase: str, s: dict[str, Any]) -> list[str]:
    if not s:
        return [f"{name} {phase}: no frames paired with the driver's records"]

    def cells(row: dict[str, float]) -> str:
        return "  ".join(f"{k} {'-' if math.isnan(v) else f'{v:.2f}'}" for k, v in row.items()
                         if k in ("ms", *PARTS) or (not math.isnan(v) and v >= 0.05))

    lines = [f"{name} {phase} (ms; {s['n']} frames, {s['n_slow']} slowest):",
             f"   all (median)   {cells(s['all'])}",
             f"   slow (median)  {cells(s['slow'])}"]
    lines += [f"   worst          {cells(w)}" for w in s["worst"]]
    return lines


class SplitRun(ContentionRun):
    """A managed run that also splits the camera's frames (the module's docstring).

    A subclass splits another app's requests by setting the app, the event its app
    reports per request, and the latency quantile whose slowest rows it summarizes
    (bench/contention_embed_split.py: the embedder's batches)."""

    split_app = "camera"
    split_event = "frame"
    split_q = 0.95

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.records: dict[str, list[list[float | None]]] = {}
        self.frame_split: dict[str, dict[str, Any]] = {}
        #: phase -> when its records were fetched (CLOCK_MONOTONIC): a frame the app
        #: reported after that has no record yet, so the split covers the window up to it.
        self.fetched_at: dict[str, float] = {}
        #: phase -> how many of the app's requests the split had to pair (its window's,
        #: up to the fetch)
        self.split_frames: dict[str, int] = {}

    def phase(self, name: str, seconds: float) -> None:
        if not self.managed or name not in self.phases:
            super().phase(name, seconds)
            return
        # The records are fetched as the phase's window ends, not after the phase's own
        # bookkeeping (its CPU and threads, which takes longer than the driver's last
        # KEPT_RECENT requests last at the embedder's rate: 11460 items/s, 0.5 ms batches,
        # left none of them in the window and nothing paired).
        timer = threading.Timer(seconds, self._fetch, args=(name,))
        timer.start()
        try:
            super().phase(name, seconds)
        finally:
            timer.join()

    def _fetch(self, name: str) -> None:
        with contextlib.suppress(Exception):  # (the split must not end the run)
            from npumanager.hal.wire import SERVICE
            from npumanager.wire.client import SyncRpcClient

            # (the host that serves the split app: a second one for own-host rows, the
            # device's background lane for a BACKGROUND app where it has one)
            sock = contention_probe.driver_socket(self.rt, device=self.devices.get(self.split_app))
            # (the lane's socket, not the config's key: protect_foreground = "auto" may
            # start the lane with no key set)
            lane = lane_socket(sock, BACKGROUND_LANE)
            if self.apps[self.split_app].priority >= ModelPriority.BACKGROUND \
                    and os.path.exists(lane):
                sock = str(lane)
            rpc = SyncRpcClient(sock, SERVICE,
                                client_name=f"contention split ({self.split_app})")
            try:
                # Stamped before the call: a frame reported before this had its answer
                # recorded before the driver read its records. (The window's end is the
                # phase's, a little later on a loaded machine: a frame between the two
                # has no record, and pairing it is not the split's to do.)
                fetched = time.monotonic()
                payload, _ = rpc.call("device.stats", b"recent")
            finally:
                rpc.close()
            self.fetched_at[name] = fetched
            self.records[name] = camera_records(
                json.loads(payload), UIDS[self.split_app] if self.root else None)

    def collect(self, r: RunResult) -> None:
        super().collect(r)
        frames = self.events.find(self.split_app, self.split_event)
        for name, (a, b) in self.windows.items():
            end = min(b, self.fetched_at.get(name, b))
            mine = in_window([(e["t"], e["ms"]) for e in frames], a, end,
                             self.records.get(name, []))
            self.split_frames[name] = len(mine)
            self.frame_split[name] = summarize(split(mine, self.records.get(name, [])),
                                               q=self.split_q)
