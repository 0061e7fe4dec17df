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

``marks`` splits the serve itself (from the request seen to the answer out and the
bookkeeping after it) into stages (``STAGES``): ``time.perf_counter_ns`` marks the
burst's thread takes on its way (a list store and one C call each, always on), each
request's kept in ``recent`` as the µs of each stage (NaN: the request did not pass
that mark, e.g. a full reply has no ``answered`` before its end is recorded), with
their medians in the snapshot: where a served request's time goes, request by request.

A stage's wall time does not say whether the thread ran slowly (cold caches, a slow
vCPU) or did not run (waiting for the GIL, the host's lock, a CPU). With
``$NPU_BURST_CPU_MARKS`` set in the host's environment (a diagnostic: ~1.6 µs per mark)
each mark also takes the thread's CPU time (``time.thread_time_ns``) and its run-queue
wait (``/proc/thread-self/schedstat``'s second field: runnable but not running), and
``recent`` entries carry each stage's CPU µs and run-queue µs after its wall µs
(``stages_cpu_p50_us``, ``stages_runq_p50_us``). Wall - CPU - run-queue is the time the
thread was blocked: a futex (the GIL, the host's lock) or a system call that slept.
"""

from __future__ import annotations

import math
import os
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

#: Requests whose times are kept.
KEPT_RECENT = 2048

#: How a request was found (``recent``'s ``how``).
AHEAD = 0  # in the header before the thread waited (written while it answered the last)
RUNG = 1  # its doorbell woke the thread from a plain wait
POLLED = 2  # the poll window caught it
EARLY = 3  # its doorbell woke the thread from the timed sleep before the window
LATE = 4  # its doorbell woke the thread after a window that ended without it
FOLLOWED = 5  # the follow-on poll after a BACKGROUND answer caught it (drivers/follow.py)
HOW = ("ahead", "rung", "polled", "early", "late", "followed")

_NAN = math.nan

#: The serve's marks (indexes into ``BurstServer.marks``), in the order a repeated
#: request passes them; each stage ends at its mark and starts at the one before it.
M_SEEN = 0  # the thread saw the new request number
M_COPIED = 1  # the request's bytes copied out of shared memory
M_LOCKED = 2  # the kept request compared, the host's lock taken
M_ADMITTED = 3  # the kept request's checks and the state's admission done (lock let go)
M_RUN0 = 4  # about to run the step (ORT's run is ``run_us`` inside RUN0..RUN1)
M_RUN1 = 5  # the step's run over, its outputs placed
M_LOCKED2 = 6  # the host's lock taken again for the step's end
M_ANSWERED = 7  # the answer written (SAME: before the end is recorded)
M_RUNG = 8  # the doorbell rung back
M_ENDED = 9  # the step's end recorded in the state (lock let go)
#: (A short repeat run first, burst_exec ``_run_first``: ``admit`` is the one pass's check
#: only, ``lock2`` is 0, and ``end`` records the admission and the end, after the ring.)
M_DONE = 10  # the loop woken, the ring drained, the next execution made: ready again
STAGES = ("copy", "lock", "admit", "to_run", "run", "lock2", "answer", "ring", "end",
          "after")
MARKS = len(STAGES) + 1


@dataclass(slots=True)
class BurstCounters:
    served: int = 0
    #: Served, by how each was found (indexes as ``HOW``).
    found: list[int] = field(default_factory=lambda: [0] * len(HOW))
    #: Warm-ups run before a window, windows that ended without a request, waits with
    #: anticipation on but no plan (no steady pace learnt yet, or the window was over),
    #: windows skipped because another burst held the poll, and windows given up for
    #: another uid's turn (drivers/poll_turns.py).
    warms: int = 0
    expired: int = 0
    unplanned: int = 0
    busy: int = 0
    deferred: int = 0
    #: Warm-ups that rehearsed the one pass too (drivers/burst_exec.py ``rehearse``).
    rehearsed: int = 0
    #: Follow-on polls after a BACKGROUND answer (drivers/follow.py), and those that
    #: ended without the next request.
    follows: int = 0
    follow_expired: int = 0
    #: The request being waited for: its predicted due time, when the thread was to wake
    #: from its timed sleep and when it did, the warm-up's start and end, when polling
    #: began (NaN: did not).
    due: float = _NAN
    wake_at: float = _NAN
    woke: float = _NAN
    warm0: float = _NAN
    warm1: float = _NAN
    poll0: float = _NAN
    #: The window planned: when it opened and when it was to end.
    opens: float = _NAN
    until: float = _NAN
    #: (seen, how, due, woke, warm0, warm1, poll0, answered, run_us, wake_at, seq,
    #: marks, (their CPU marks, run-queue marks) or None, opens, until, called, rung) per
    #: request (``seq``: the request's sequence number, so a bench pairs each with the
    #: client's call that rang it even when a request was skipped or answered twice; the
    #: marks as ``BurstServer.marks``, made stages as ``STAGES`` by ``entries``; the
    #: window; the client's stamps, s, as it wrote them: NaN for none).
    recent: deque[tuple[Any, ...]] = field(
        default_factory=lambda: deque(maxlen=KEPT_RECENT))

    def waiting(self) -> None:
        """The thread begins to wait for the next request."""
        self.due = self.wake_at = self.woke = self.warm0 = self.warm1 = self.poll0 = _NAN
        self.opens = self.until = _NAN

    def served_one(self, how: int, seen: float, answered: float, run_us: float,
                   seq: int = 0, marks: list[int] | None = None,
                   stamps: tuple[float, float] = (_NAN, _NAN)) -> None:
        """One request served; ``marks`` (``perf_counter_ns``, 0: not passed) are read
        and cleared; ``stamps``: the client's (called, rung), s."""
        self.served += 1
        self.found[how] += 1
        if marks is None:
            marks = _CLEAR
        cpu = None
        if isinstance(marks, CpuMarks):
            cpu = (tuple(marks.cpu), tuple(marks.runq))
        # The marks as they are: their stages are worked out when read (``entries``), not
        # on the burst's thread once per request (trim22).
        self.recent.append((seen, float(how), self.due, self.woke, self.warm0, self.warm1,
                            self.poll0, answered, run_us, self.wake_at, float(seq),
                            tuple(marks), cpu, self.opens, self.until, *stamps))
        marks[:] = _CLEAR

    def entries(self) -> list[tuple[float, ...]]:
        """The kept requests' records: (seen, how, due, woke, warm0, warm1, poll0,
        answered, run_us, wake_at, seq, *stage µs, [*their CPU µs, *run-queue µs,] opens,
        until, called, rung) each (see ``recent``)."""
        out = []
        for r in list(self.recent):  # (one C call: the burst's thread may append meanwhile)
            marks, cpu = r[_MARKS], r[_MARKS + 1]
            extra: list[float] = []
            if cpu is not None:
                extra = [*stages(list(cpu[0]), list(marks)), *stages(list(cpu[1]), list(marks))]
            out.append((*r[:_MARKS], *stages(list(marks)), *extra, *r[_MARKS + 2:]))
        return out

    def snapshot(self, recent: bool) -> dict[str, Any]:
        """JSON-ready: the counts, the arrival offsets from the predicted due time
        (median and p90, µs; negative: before it), and with ``recent`` every kept
        request's times."""
        kept = self.entries()
        offsets = sorted((r[0] - r[2]) * 1e6 for r in kept if not math.isnan(r[2]))
        stamped = sorted((r[0] - r[-1]) * 1e6 for r in kept if not math.isnan(r[-1]))
        out: dict[str, Any] = {
            "served": self.served, **dict(zip(HOW, self.found, strict=True)),
            "warms": self.warms, "expired": self.expired, "unplanned": self.unplanned,
            "busy": self.busy, "deferred": self.deferred, "rehearsed": self.rehearsed,
            "follows": self.follows, "follow_expired": self.follow_expired,
            "offsets_n": len(offsets),
            "offset_p50_us": _pct(offsets, 0.5), "offset_p90_us": _pct(offsets, 0.9),
            "rung_seen_p50_us": _pct(stamped, 0.5), "rung_seen_p90_us": _pct(stamped, 0.9),
        }
        for key, first in (("stages_p50_us", _FIRST), ("stages_cpu_p50_us", _FIRST_CPU),
                           ("stages_runq_p50_us", _FIRST_RUNQ)):
            if kept and len(kept[-1]) - _TAIL > first:
                out[key] = {name: _pct(sorted(v for r in kept if len(r) - _TAIL > first + i
                                              and not math.isnan(v := r[first + i])), 0.5)
                            for i, name in enumerate(STAGES)}
        if recent:
            out["recent"] = [[None if math.isnan(x) else x for x in r] for r in kept]
        return out


_CLEAR = [0] * MARKS
#: Where a ``recent`` record keeps its marks (then its CPU and run-queue marks, or None).
_MARKS = 11
#: Where the stages begin in a ``recent`` entry: wall µs, then (``CpuMarks``) CPU µs and
#: run-queue µs.
_FIRST = 11
_FIRST_CPU = _FIRST + len(STAGES)
_FIRST_RUNQ = _FIRST_CPU + len(STAGES)
#: Every entry ends in (opens, until, called, rung), after the stages (and their CPU and
#: run-queue splits, when on).
_TAIL = 4
#: The environment variable that turns ``CpuMarks`` on in a driver host.
CPU_MARKS_ENV = "NPU_BURST_CPU_MARKS"


def new_marks() -> list[int]:
    """A burst thread's marks: ``CpuMarks`` where ``$NPU_BURST_CPU_MARKS`` is set (call
    it on that thread: it opens the thread's own schedstat), else a plain list."""
    if os.environ.get(CPU_MARKS_ENV):
        return CpuMarks()
    return [0] * MARKS


class CpuMarks(list[int]):
    """Marks that also note, at each, the thread's CPU time and run-queue wait (ns)."""

    def __init__(self) -> None:
        super().__init__([0] * MARKS)
        self.cpu = [0] * MARKS
        self.runq = [0] * MARKS
        try:
            self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = -1

    def __setitem__(self, i: Any, v: Any) -> None:
        super().__setitem__(i, v)
        if isinstance(i, slice):
            self.cpu[:] = self.runq[:] = _CLEAR
            return
        self.cpu[i] = time.thread_time_ns()
        if self._fd >= 0:
            try:
                self.runq[i] = int(os.pread(self._fd, 64, 0).split()[1])
            except (OSError, IndexError, ValueError):
                self.runq[i] = 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def stages(marks: list[int], order: list[int] | None = None) -> list[float]:
    """Each stage's µs from ``marks``: from the mark passed just before its own, in
    time, to its own (NaN where its own was not passed). In time, not in index order:
    a full reply is written after its end is recorded, so its ``answer`` stage is the
    writing of the reply after ``end``. ``order``: the wall-clock marks that give the
    order (and say which were passed) when ``marks`` are another clock's."""
    if order is None:
        order = marks
    out = [_NAN] * (MARKS - 1)
    passed = [(t, i) for i, t in enumerate(order) if t]
    passed.sort()
    for (_, i0), (_, i) in pairwise(passed):
        if i:
            out[i - 1] = (marks[i] - marks[i0]) / 1e3
    return out


def _pct(xs: list[float], q: float) -> float | None:
    return round(xs[min(len(xs) - 1, int(len(xs) * q))], 1) if xs else None
