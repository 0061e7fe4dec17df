"""A background thread lowered only around its native work (``background_lower = "run"``).

``background_lower = "thread"`` lowers a background worker (SCHED_IDLE, or nice) for good
when it starts (:func:`.bg_threads.lower_this_thread`). Such a thread also runs Python: the
step's bookkeeping before and after ONNX Runtime's ``run``, the hand-back of its result,
the recording. It holds the host's GIL then, and at SCHED_IDLE the kernel deschedules it
behind any normal thread (the compile child, the apps), while the foreground's burst
thread waits for the GIL it holds: a priority inversion. bench/contention_trace.py
counted it as the largest cause of slow camera frames while a background model loads
(9 frames, 24.7 ms of excess in one trace, 7 of them during the compile child's compile).

With ``"run"`` the thread stays at normal priority while it holds the GIL and lowers
itself just for the native call, which releases the GIL (with one intra-op thread ONNX
Runtime runs the graph on the calling thread): :meth:`RunLowering.lower` right before it,
:meth:`RunLowering.restore` right after. The cost is two syscalls per step
(bench/lower_switch.py). A thread ONNX Runtime creates meanwhile (a session's pool, built
inside :func:`native`) inherits the lowered policy, as with ``"thread"``.

Leaving SCHED_IDLE (or a nice value) needs the host to be allowed: RLIMIT_NICE of 20 for
nice 0 (:mod:`.compile_starve`; a host that npud starts as root has it). A thread that
may not return stays lowered for good, as with ``"thread"``, and says so once in the log.

Measured (drivers/classes.py, session 12): the camera's p99 while a model loads did not fall
(four quick pairs and a full run), traces found a step worker's descheduled GIL hold rare
either way, and the LLM lost 4-7 % of its tokens/s in every pair: an opt-in, not the default.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from npumanager.drivers.compile_starve import can_raise

log = logging.getLogger("npumanager.drivers.lowering")

BACKGROUND_LOWER = ("thread", "run")

_PARAM = os.sched_param(0)
_local = threading.local()
_warned = threading.Lock()


class RunLowering:
    """The calling thread's switch between normal priority and ``sched`` ("idle": SCHED_IDLE;
    "nice": nice ``nice``), made on that thread."""

    __slots__ = ("base_nice", "idle", "nice", "tid")

    def __init__(self, sched: str, nice: int) -> None:
        self.idle = sched == "idle"
        self.nice = nice
        self.tid = threading.get_native_id()
        #: The nice value the thread returns to (a SCHED_IDLE thread keeps its own).
        self.base_nice = os.getpriority(os.PRIO_PROCESS, self.tid)

    def lower(self) -> None:
        if self.idle:
            os.sched_setscheduler(self.tid, os.SCHED_IDLE, _PARAM)
        else:
            os.setpriority(os.PRIO_PROCESS, self.tid, self.nice)

    def restore(self) -> None:
        """Back to normal priority; PermissionError where the rlimit does not allow it."""
        if self.idle:
            os.sched_setscheduler(self.tid, os.SCHED_OTHER, _PARAM)
        else:
            os.setpriority(os.PRIO_PROCESS, self.tid, self.base_nice)


def current() -> RunLowering | None:
    """The calling thread's lowering around native work (None: it has none, as a
    foreground thread, or a background one lowered for good)."""
    return getattr(_local, "lowering", None)


def set_current(low: RunLowering | None) -> None:
    """The calling thread's lowering around native work from now on (None: none): for a
    thread lowered only for some of its runs (a burst's BACKGROUND steps, .bg_here)."""
    _local.lowering = low


def try_switch(sched: str, nice: int) -> RunLowering:
    """A switch for the calling thread, tried once (a lower and a return) so that it is
    known to work both ways. OSError where it does not: PermissionError where the thread
    may not return to its nice value (RLIMIT_NICE, checked first, so such a thread is
    never lowered), another where lowering itself fails (a seccomp filter, no
    SCHED_IDLE); the thread is left at normal priority either way, unless the return
    itself is refused after the check said yes."""
    low = RunLowering(sched, nice)
    if not can_raise(low.base_nice):
        raise PermissionError("RLIMIT_NICE does not allow a lowered thread to return to "
                              f"nice {low.base_nice}")
    try:
        low.lower()
    except AttributeError as exc:  # no sched_setscheduler: not Linux
        raise OSError(str(exc)) from None
    low.restore()
    return low


def arm_this_thread(sched: str, nice: int) -> bool:
    """Make the calling thread one lowered only around native work (:func:`try_switch`).
    False where it cannot be (the caller lowers it for good instead, as "thread")."""
    try:
        low = try_switch(sched, nice)
    except PermissionError as exc:
        if _warned.acquire(blocking=False):
            log.warning("background_lower = \"run\": a lowered thread may not return to "
                        "normal priority (%s); background threads stay lowered for good", exc)
        return False
    except OSError as exc:
        log.warning("background threads stay at normal priority: %s", exc)
        return False
    _local.lowering = low
    return True


def give_up(low: RunLowering, exc: BaseException) -> None:
    """After a failed :meth:`RunLowering.restore`: the thread stays lowered from now on."""
    _local.lowering = None
    if _warned.acquire(blocking=False):
        log.warning("background_lower = \"run\": thread %d stays lowered: %s", low.tid, exc)


@contextmanager
def native() -> Iterator[None]:
    """Around native work that releases the GIL (building a session from artifacts): the
    calling thread lowered within, if it is a thread lowered only around native work."""
    low = current()
    if low is None:
        yield
        return
    low.lower()
    try:
        yield
    finally:
        try:
            low.restore()
        except OSError as exc:
            give_up(low, exc)
