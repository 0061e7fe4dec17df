"""Where a background lane's next step may run: off the CPUs the other background steps run
on now (pure; ``background_cpus = "steer"``, the shell in :mod:`.steps`).

Background steps run on ``SCHED_IDLE`` threads. The kernel never lets a waking
``SCHED_IDLE`` thread preempt a running one, yet counts a CPU that runs only such threads
as idle when it places a waking thread: an embedder's short step woken onto the CPU where
the LLM's long step runs waited there for the scheduler's tick (4 ms) while the other CPU
idled (21 % of its batches over 2 ms in the driver: bench/contention.py --device-time).
Lanes (:mod:`.runqueue`, ``"lanes"``) keep lane k's thread on CPU k for good, which fixes
that, and measured to cost the camera (bench/README.md: ``background_cpus``); why is not known. One
suspect is the pin itself: an LLM step pinned to the CPU the camera wakes on stays there,
behind the camera, even when the other CPU is free.

Steering keeps the lanes (one thread per lane, so the thread a step wakes is known) but
not the pins: the thread that hands a step to lane k sets that thread's CPUs just before
it wakes it, to every CPU the host may use less those where the other lanes' steps run
now, or to all of them when no other background step runs. So two background steps still
never share a CPU, and a background step that runs alone may run anywhere.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping


def steer(allowed: Iterable[int], running: Mapping[int, int], lane: int) -> frozenset[int]:
    """The CPUs lane ``lane``'s next step may run on: ``allowed`` less the CPUs where the
    other lanes' steps run now (``running``: lane -> the CPU its step started on); all of
    ``allowed`` when no other step runs, or when none would be left."""
    cpus = frozenset(allowed)
    busy = {cpu for k, cpu in running.items() if k != lane}
    free = cpus - busy
    return free if free else cpus
