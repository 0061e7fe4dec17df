"""A BACKGROUND burst step's run handed back to the burst's own thread.

A burst execution whose step the state starts as BACKGROUND runs that step on a lowered
worker (``SCHED_IDLE``: :mod:`.steps`). Before this module the worker queued the step's
end for :mod:`.bg_ends`' normal-priority thread, which submitted it under the host's lock
and woke the burst's thread with the job's outcome; the burst's thread then answered.
That is three thread hand-offs per batch (burst -> worker -> bg_ends -> burst) and the
answer after the end's bookkeeping. The embedder's managed batch took ~0.5 ms more in
the driver than its step (bench/contention.py --device-time).

With a :class:`Handback` the worker gives the run's result to the burst's thread, which
waits for it anyway, and that thread records the end under the lock exactly as it does
for a step it ran itself: the answer first when the state says the end is COMPLETED
(``completes``), then the bookkeeping (``repeat_end``). Two hand-offs, no third thread,
and the lowered worker still never takes the host's lock (:mod:`.bg_ends` says why that
matters: a preempted ``SCHED_IDLE`` holder kept the camera's burst thread waiting).

Exactly one thread submits each step's end. The worker and the burst's thread race for
``claim`` with a non-blocking acquire (no thread ever waits on it): the worker takes it
before it leaves the result, and the burst's thread gives it back once it took the
result; a burst's thread that stops waiting (the burst closing) takes it itself if it is
free, and from then on every run of the execution goes to ``fallback`` (:mod:`.bg_ends`),
as before this module.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from npumanager.drivers.steps import Execution

Ran = tuple[str | None, float]


class Handback:
    """One burst execution's lowered runs, handed to the burst's thread that waits."""

    __slots__ = ("_claim", "_fallback", "_result", "left")

    def __init__(self, fallback: Callable[[Execution, str | None, float], None]) -> None:
        # (no reference to the execution: it is the execution's, and the execution holds
        # the client's pool, a mapping and an fd, which a cycle would keep until the
        # garbage collector ran)
        self._fallback = fallback
        self._claim = threading.Lock()
        self._result: Ran | None = None
        #: The burst's thread stopped waiting (``leave``): every end goes to ``fallback``.
        self.left = False

    def ran(self, ex: Execution, error: str | None, run_us: float) -> None:
        """On the lowered worker, ``ex``'s step over: hand its result to the burst's thread
        and wake it, or (that thread left) to ``fallback``."""
        if not self._claim.acquire(blocking=False):
            self._fallback(ex, error, run_us)
            return
        # ``done`` read before the result is left: once it is, the burst's thread may take
        # it (woken by its wait's tick) and arm a fresh ``done`` for its next wait, which a
        # set from here would leave set, so that wait would spin until the next result.
        done = ex.done
        self._result = (error, run_us)
        if done is not None:
            done.set()

    def take(self) -> Ran | None:
        """On the burst's thread, once woken: the run's result, if one was handed over
        (None: the wake-up was something else, the job's end or the burst closing)."""
        result = self._result
        if result is None:
            return None
        self._result = None
        self._claim.release()
        return result

    def leave(self) -> bool:
        """On the burst's thread, which stops waiting: True when no run is being handed
        over (every later end goes to ``fallback``); False when one is (the worker took
        the claim: its result comes at once, and this thread must take it)."""
        if self._claim.acquire(blocking=False):
            self.left = True
            return True
        return False
