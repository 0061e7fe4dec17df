"""Where a background load's work runs, and where the foreground keeps meanwhile (``load_cpus``).

A background load (the compile child's compile, then the host's session build on a
lowered thread) runs at ``SCHED_IDLE``, and mostly in the kernel: bench/load_cpu.py
measured the compile child at 86 % system time and the session build at 73 %, most of
it page faults and the copies of model-sized buffers. This kernel is ``PREEMPT_NONE``:
a ``SCHED_IDLE`` thread in kernel mode keeps its CPU until it returns to user mode or
reaches a ``cond_resched``, however high the priority of the thread woken behind it.
So the camera's wake-ups can wait on whichever CPU the load happens to be on.

``"last"``: the compile child (every thread of it) and the lowered threads that build a
background model's session run on the highest CPU only (a load is one thread at a time:
the child's compile, then the session build), so the other CPUs never run load work.
``"split"``: "last", and while a background load is in progress the FOREGROUND burst
threads keep to the other CPUs (each sets its own affinity before it waits for its next
request, only when the state changed: one ``sched_setaffinity`` per load start and end
per burst), so the camera's burst thread is never woken onto the load's CPU.

Measured, neither helps: three full same-run invocations of bench/contention.py against
the defaults, camera p99 while a model loads "last" 5.8 / 5.1 / 2.8, "split" 5.5 / 5.2 /
5.1 vs 3.0 / 4.0 / 3.4 ms (bench/README.md: ``load_cpus``). Kept off the load's CPU, the camera's
burst thread waits for the one CPU that the apps and the step workers share. Opt-ins.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator

log = logging.getLogger("npumanager.drivers.load_place")

LOAD_CPUS = ("all", "last", "split")


def allowed_cpus() -> frozenset[int]:
    try:
        return frozenset(os.sched_getaffinity(0))
    except (OSError, AttributeError):
        return frozenset()


class LoadPlace:
    """The CPUs of a host's background loads and, with ``split``, of its FOREGROUND burst
    threads while one runs. ``load_cpus`` is None ("all", or fewer than two CPUs): nothing
    is placed."""

    def __init__(self, mode: str) -> None:
        if mode not in LOAD_CPUS:
            raise ValueError(f"load_cpus must be one of {', '.join(LOAD_CPUS)}, not {mode!r}")
        self.all = allowed_cpus()
        self.load_cpus: set[int] | None = None
        if mode != "all" and len(self.all) >= 2:
            self.load_cpus = {max(self.all)}
        #: The FOREGROUND burst threads' CPUs while a background load runs (None: all).
        self.others: frozenset[int] | None = (
            self.all - self.load_cpus if mode == "split" and self.load_cpus else None)
        #: Background loads in progress (changed on the event loop, read by burst threads).
        self.loads = 0

    @contextlib.contextmanager
    def loading(self) -> Iterator[None]:
        """Around a background prepare (on the event loop)."""
        self.loads += 1
        try:
            yield
        finally:
            self.loads -= 1

    def foreground_cpus(self) -> frozenset[int] | None:
        """Where a FOREGROUND burst thread may run now (None: nothing to place)."""
        if self.others is None:
            return None
        return self.others if self.loads > 0 else self.all


class Placed:
    """One burst thread's side: the CPUs it set for itself last."""

    __slots__ = ("cpus", "place")

    def __init__(self, place: LoadPlace | None) -> None:
        self.place = place if place is not None and place.others is not None else None
        self.cpus: frozenset[int] | None = None

    def update(self, foreground: bool) -> None:
        """On the burst's own thread, before it waits for its next request: keep off the
        load's CPU while a background load runs and the stream is FOREGROUND; back on
        every CPU otherwise. A syscall only when that changes."""
        place = self.place
        if place is None:
            return
        want = place.foreground_cpus() if foreground else place.all
        if want is None or want == self.cpus or (self.cpus is None and want == place.all):
            return
        try:
            os.sched_setaffinity(threading.get_native_id(), want)
        except OSError as exc:
            log.warning("a burst thread stays where it is: %s", exc)
            self.place = None
            return
        self.cpus = want
