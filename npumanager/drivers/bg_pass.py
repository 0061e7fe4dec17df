"""A queued BACKGROUND burst step passed to the burst thread that just answered
(``background_burst_here = "normal-pass"``).

With ``background_burst_here = "normal"`` (:mod:`.bg_here`) a burst's BACKGROUND step runs
on the burst's own thread only when the state starts it while that thread submits it. A
step the state starts later goes to a lowered worker, which hands the result back
(:mod:`.bg_handback`): an app that keeps two batches in flight (the SDK's pipeline, bench
row ``embedder-pipeline``) has its second batch wait for the model its first holds, and
then run on a ``SCHED_IDLE`` worker (session 13: 9828 items/s with the pipeline and
``"normal"`` vs 11278 with ``"normal"`` alone, same run).

Here the thread that ends a step (a burst's, normal priority, the host's lock held) keeps
a BACKGROUND step the state starts for another burst execution whose own thread waits for
a hand-back (``handback`` set, ``bg_here``: a burst served the same way), and runs it
itself once its own answer is out (:meth:`.resources.HostResources.wake_loop`, which a
burst's thread calls after each answer and before it waits): no worker to wake; the
result goes back to the waiting thread exactly as a worker's would (``Handback.ran``).
Not a step with a lane or one that yields (those need the workers' placement).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from npumanager.drivers.events import RunStep
    from npumanager.drivers.steps import Execution

_local = threading.local()


def passable(ex: Execution | None, step: RunStep) -> bool:
    """Whether ``step`` of ``ex`` may be passed to a burst thread at all."""
    return (ex is not None and ex.handback is not None and ex.bg_here != 0
            and step.background and not step.inline and step.lane is None
            and not step.yields)


def keep(ex: Execution, step: RunStep) -> None:
    """On the thread that will run it (the lock held): ``step`` of ``ex`` kept for
    :func:`take`."""
    kept: list[tuple[Execution, RunStep]] | None = getattr(_local, "kept", None)
    if kept is None:
        kept = _local.kept = []
    kept.append((ex, step))


def take() -> list[tuple[Execution, RunStep]]:
    """The calling thread's kept steps, in order (none left kept)."""
    kept: list[tuple[Execution, RunStep]] | None = getattr(_local, "kept", None)
    if not kept:
        return []
    _local.kept = []
    return kept


__all__ = ["keep", "passable", "take"]
