"""The ends of BACKGROUND burst steps, submitted on a normal-priority thread.

A burst execution's step that runs on a lowered worker (``SCHED_IDLE``, the host's
cpu.idle cgroup) used to submit its own end from that worker: the host's lock taken, the
driver state's Python run under the GIL, the next step started, all on a thread the
kernel runs only when no normal thread wants the CPU. Preempted there, it held the lock
(and the GIL) while the foreground burst thread serving the camera's next frame waited for
them: bench/contention_trace.py found the burst thread blocked behind a runnable
``SCHED_IDLE`` holder in 9 of 34 slow loading-phase frames (11.7 ms of their excess).

So the worker only queues the end (a C-level put: no host lock, the GIL for a moment) and
this thread, at normal priority, submits it under the lock as the worker did: no loop
wake-up either (a burst's guarantee). It never runs a BACKGROUND step itself: a step of
the job that the state starts goes to the lowered workers as before; only an inline one
(cheap by the state's measure, which the loop would run at the same priority) or one the
job's class made FOREGROUND runs here. The cost: one futex wake-up of a normal thread per
background burst step's end, and its ~50-100 µs of Python at normal priority.

Measured against the old way (``background_ends = "worker"``: the worker submits the end
itself; bench variant bg-ends-worker), three quick same-run pairs before the handback
(:mod:`.bg_handback`) landed, camera p99 thread / worker: contended 2.0 / 2.7, 1.3 / 3.8,
1.9 / 1.1 ms; while a model loads 6.0 / 5.2, 5.6 / 6.8, 5.1 / 5.8 ms; embedder 3205 /
3335, 3601 / 3225, 3505 / 3719 items/s. No difference beyond the runs' spread, so it is
not what raised session 10's contended median (1.02x -> 1.47x of the camera alone), and
it stays: a kernel trace of the loading phase (bench/contention_trace.py) still finds the
camera's burst thread blocked while lowered step workers (and this thread) wait runnable,
and this thread is the one of them that is never lowered. Since the handback (default
on) a BACKGROUND burst step's end is recorded by the burst's own thread; this thread
takes only the ends the handback leaves (a burst closing while its step runs, or
``background_handback = false``).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from npumanager.drivers.bg_threads import name_this_thread
from npumanager.drivers.steps import Execution

log = logging.getLogger("npumanager.drivers.bg_ends")

End = tuple[Execution, str | None, float]


class StepEnds:
    """One normal-priority thread per host; started (from a normal thread) on creation."""

    def __init__(self, name: str, submit: Callable[[Execution, str | None, float], None]
                 ) -> None:
        self._submit = submit
        self._q: queue.SimpleQueue[End | None] = queue.SimpleQueue()
        self.ended = 0  # ends submitted (tests)
        # Created here, on the host's own (normal) thread: a thread inherits its creator's
        # policy and cgroup, and one started from a lowered worker would be lowered too.
        self._thread = threading.Thread(target=self._run, name=f"npu-{name}-bgend",
                                        daemon=True)
        self._thread.start()

    @classmethod
    def for_host(cls, name: str, where: str,
                 submit: Callable[[Execution, str | None, float], None]) -> StepEnds | None:
        """The host's thread for ``background_ends = "thread"``; None for ``"worker"``
        (each end submitted by the worker that ran the step, as before this module)."""
        if where not in ("thread", "worker"):
            raise ValueError(f"background_ends must be 'thread' or 'worker', not {where!r}")
        return cls(name, submit) if where == "thread" else None

    def put(self, ex: Execution, error: str | None, run_us: float) -> None:
        """From the lowered worker that ran the step: queue its end."""
        self._q.put((ex, error, run_us))

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(10.0)

    def _run(self) -> None:
        name_this_thread()
        while True:
            item = self._q.get()
            if item is None:
                return
            try:
                self._submit(*item)
            except Exception:  # the host logs its own; this thread must go on
                log.exception("a background step's end failed")
            # Not kept while waiting for the next: the execution holds the client's pool
            # (a mapping, an fd) until the last reference goes.
            del item
            self.ended += 1
