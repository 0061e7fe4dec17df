"""What the demo watches: the apps' event streams and the driver's HAL work events.

:class:`EventLog` keeps every event the apps report (thread-safe, with waits
for the scenario), and :class:`HalObserver` is an ``ISchedulingCallback`` that
records the reference driver's work lifecycle (requested, started
INITIAL/RESUMED, ended COMPLETED/PAUSED/...), which is how the demo shows
background decode jobs being paused for foreground frames.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from npumanager.hal.types import EndReason, ISchedulingCallback, StartReason, WorkInfo

Event = dict[str, Any]


class AppFailed(Exception):
    """An app could not start (it reported ``error`` with ``what="connect"``): every wait
    for its events, and the scenes after, would wait out their timeouts in vain."""

    def __init__(self, ev: Event) -> None:
        self.app, self.error = str(ev["app"]), str(ev["error"])
        super().__init__(f"{self.app} could not connect: {self.error}")


class EventLog:
    """Every event from every app, in arrival order; ``wait`` blocks until one matches.
    With ``stop_on_failure``, ``wait`` and ``hold`` raise :class:`AppFailed` once any app
    has reported that it could not connect."""

    def __init__(self, stop_on_failure: bool = False) -> None:
        self.events: list[Event] = []
        self._cond = threading.Condition()
        self.listeners: list[Callable[[Event], None]] = []
        self._telling = threading.Lock()  # held while listeners are called (mute)
        self.stop_on_failure = stop_on_failure
        #: The first app's connect failure, if any (see AppFailed).
        self.failed: Event | None = None

    def add(self, ev: Event) -> None:
        with self._cond:
            self.events.append(ev)
            if self.failed is None and ev["ev"] == "error" and ev.get("what") == "connect":
                self.failed = ev
            self._cond.notify_all()
        with self._telling:
            for fn in self.listeners:
                fn(ev)

    def mute(self) -> None:
        """No listener is called once this returns (an event being told now is first
        finished): the demo's narration stops before it says it is stopping."""
        with self._telling:
            self.listeners.clear()

    def find(self, app: str | None = None, ev: str | None = None, after: float = 0.0,
             pred: Callable[[Event], bool] | None = None) -> list[Event]:
        with self._cond:
            return [e for e in self.events
                    if (app is None or e["app"] == app) and (ev is None or e["ev"] == ev)
                    and e["t"] >= after and (pred is None or pred(e))]

    def wait(self, app: str | None, ev: str, timeout: float, after: float = 0.0,
             pred: Callable[[Event], bool] | None = None) -> Event | None:
        """The first matching event at or after ``after`` (waiting up to ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                self._raise_failed()
                for e in self.events:
                    if ((app is None or e["app"] == app) and e["ev"] == ev and e["t"] >= after
                            and (pred is None or pred(e))):
                        return e
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.1))

    def hold(self, seconds: float) -> None:
        """Sleep ``seconds``; cut short by an app's failure (``stop_on_failure``)."""
        deadline = time.monotonic() + seconds
        with self._cond:
            while True:
                self._raise_failed()
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(left)  # add() wakes it

    def _raise_failed(self) -> None:
        if self.stop_on_failure and self.failed is not None:
            raise AppFailed(self.failed)


@dataclass(frozen=True)
class WorkEvent:
    t: float
    kind: str  # requested | started | ended
    work_id: int
    uid: int
    effective_priority: int
    reason: str  # INITIAL/RESUMED, COMPLETED/PAUSED/..., "" for requested


class HalObserver(ISchedulingCallback):
    """Records the driver's work events (they arrive on the IScheduling reader thread)."""

    def __init__(self) -> None:
        self.events: list[WorkEvent] = []
        self._lock = threading.Lock()

    def _add(self, kind: str, info: WorkInfo, reason: str) -> None:
        with self._lock:
            self.events.append(WorkEvent(time.monotonic(), kind, info.id, info.uid,
                                         info.effective_priority, reason))

    def on_work_requested(self, info: WorkInfo) -> None:
        self._add("requested", info, "")

    def on_work_started(self, info: WorkInfo, reason: StartReason) -> None:
        self._add("started", info, StartReason(reason).name)

    def on_work_ended(self, info: WorkInfo, reason: EndReason) -> None:
        self._add("ended", info, EndReason(reason).name)

    def between(self, t0: float, t1: float | None = None) -> list[WorkEvent]:
        with self._lock:
            return [e for e in self.events if e.t >= t0 and (t1 is None or e.t <= t1)]

    def count(self, uid: int | None, kind: str, reason: str, t0: float = 0.0,
              t1: float | None = None) -> int:
        return sum(1 for e in self.between(t0, t1)
                   if (uid is None or e.uid == uid) and e.kind == kind and e.reason == reason)

    def pause_example(self, uid: int | None, t0: float, t1: float | None = None
                      ) -> tuple[WorkEvent, WorkEvent] | None:
        """A PAUSED end of ``uid``'s work and its RESUMED start."""
        evs = self.between(t0, t1)
        for i, e in enumerate(evs):
            if e.kind == "ended" and e.reason == "PAUSED" and (uid is None or e.uid == uid):
                for j in range(i + 1, len(evs)):
                    r = evs[j]
                    if r.work_id == e.work_id and r.kind == "started" and r.reason == "RESUMED":
                        return e, r
        return None
