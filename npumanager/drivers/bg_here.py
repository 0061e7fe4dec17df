"""A BACKGROUND burst step run on the burst's own thread, lowered only for its run
(``background_burst_here``).

By default a burst execution's BACKGROUND step (the contention bench's embedder: one
batch per request) runs on a lowered step worker (``npu-bg_N``, ``SCHED_IDLE`` for good,
:mod:`.steps`), which hands the result back to the burst's thread (:mod:`.bg_handback`).
That is two wake-ups per batch beside the app's own, and the worker's is the wake-up of
a ``SCHED_IDLE`` thread: the kernel never lets one preempt a running thread, and counts
a CPU that runs only such threads (the LLM's step) as idle when it places one, so the
worker can wait there for the scheduler's tick. Measured (bench/contention.py --quick
--device-time, defaults, 2 vCPUs): the embedder's step took 0.25 ms on average, the
app's batch 0.57 ms p50 and 1.64 ms p90, while the machine had half a core idle (1.51
of 2 busy): the embedder is bound by its batches' latency, not by CPU.

Here the burst's thread, woken at normal priority by the app's doorbell, runs the step
itself and lowers itself just for the backend's native run (``SCHED_IDLE`` as
``background_sched`` says, or nice ``background_nice``), back to normal priority after
it, as a worker with ``background_lower = "run"`` does (:mod:`.lowering`, whose switch
this reuses): no worker wake-up and no hand-back. Only a step the state starts at once,
while this thread submits it, runs here; one it starts later (after the quiet window, a
channel freed) still goes to the workers. The starvation bound (:mod:`.starve`) counts
these steps like the workers': one it says to boost runs here at normal priority.

Measured (bench/README.md: background_burst_here; bench rows bg-burst-here*): the embedder's
items/s +2 % in eight quick same-run pairs (+6 % lowered to nice 19, -3 % not lowered
at all), within the runs' spread: the hand-off costs ~0.02 ms of a 0.6 ms batch, whose
time goes to its single-threaded run (0.34 ms, 0.17 alone) and the round trip. An opt-in.

Leaving ``SCHED_IDLE`` (or a nice value) needs RLIMIT_NICE 20 for nice 0: a host that npud
starts as root has it where root has CAP_SYS_RESOURCE (or systemd's ``LimitNICE=+0``). It
is checked (the rlimit, then a lower and a return) once per thread; a thread that may not
return is never lowered and leaves its background steps to the workers, as without this
module. So on a host without the limit (this VM: root lacks CAP_SYS_RESOURCE, the bench's
hosts run as a driver user) ``"lowered"`` and ``"nice"`` change nothing, and the numbers
above were the defaults' (measured again, session 13: the run on the burst's thread took
21 µs of its CPU, the rest waiting for the worker). With the host as root (bench rows
``*-root``) they do run here: embedder 10586 items/s lowered, 11422 not lowered, vs 8083
(quick, one invocation; bench/README.md: background_burst_here).

``"normal"`` runs the step here without lowering the thread at all (:func:`unlowered`):
nothing to return from, so it needs no RLIMIT_NICE and works for any host. The step is
still a BACKGROUND step for everything else (the state starts it only outside the quiet
window, on a channel open to background work; the starvation bound counts it); only the
kernel sees it at normal priority, for its run (the embedder's: ~0.25 ms).
"""

from __future__ import annotations

import logging
import threading

from npumanager.drivers import lowering
from npumanager.drivers.lowering import RunLowering

log = logging.getLogger("npumanager.drivers.bg_here")

_local = threading.local()


def this_thread(sched: str, nice: int) -> RunLowering | None:
    """The calling thread's lowering for its BACKGROUND runs, checked once per thread
    (:func:`.lowering.try_switch`): None where it may not lower itself and return, or
    ``sched`` lowers nothing ("normal", "share": the workers decide there)."""
    if sched not in ("idle", "nice"):
        return None
    low: RunLowering | bool | None = getattr(_local, "low", False)
    if low is False:
        try:
            low = lowering.try_switch(sched, nice)
        except OSError as exc:
            low = None
            log.info("background_burst_here: background burst steps stay on the "
                     "workers: %s", exc)
        _local.low = low
    assert low is None or isinstance(low, RunLowering)
    return low


class Unlowered(RunLowering):
    """``background_burst_here = "normal"``: the calling thread's runs stay at its own
    priority (a switch that switches nothing, so none can fail)."""

    __slots__ = ()

    def lower(self) -> None:
        pass

    def restore(self) -> None:
        pass


def unlowered() -> RunLowering:
    """The calling thread's :class:`Unlowered` (one per thread)."""
    low: RunLowering | None = getattr(_local, "unlowered", None)
    if low is None:
        low = _local.unlowered = Unlowered("nice", 0)
    return low


def begin_runs(low: RunLowering) -> None:
    """From now until :func:`end_runs`: the calling thread's backend runs lowered by
    ``low`` (.lowering's switch around the native call, :meth:`.steps.StepRunner.run`),
    as a worker's with ``background_lower = "run"``. (Two plain calls, not a context
    manager, on a burst's thread once per batch: trim22.)"""
    lowering.set_current(low)


def end_runs() -> None:
    """After :func:`begin_runs`: a return that failed left the thread lowered, and it
    runs no more background steps itself."""
    if lowering.current() is None:  # (.lowering.give_up: the return failed)
        _local.low = None
    lowering.set_current(None)

