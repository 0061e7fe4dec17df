"""The driver host's burst threads at SCHED_FIFO while they serve FOREGROUND work
(``[[driver]] foreground_rt_priority``; bench/README.md: "Real-time foreground threads").

The host runs as the unprivileged ``driver_user``: it may lower its own threads but not
raise them (RLIMIT_RTPRIO is 0, and root here lacks CAP_SYS_RESOURCE to raise it), so a
burst thread that starts serving FOREGROUND work asks npud (``hal.request_rt`` on the
host's link, sent from the loop) and npud, after checking the thread is one of the host
process it started, applies it (service/host_rt.py). Everything else happens here without
privilege: the thread lowers itself (:mod:`.rt_policy` says when), and a thread npud made
FIFO after it stopped wanting it is lowered when npud's answer comes.

Backstop: with the key on the host sets its RLIMIT_RTTIME soft limit (``RTTIME_SOFT_US``
of CPU without blocking at RT) and handles SIGXCPU (whose default action would kill the
host) by lowering every thread it has at FIFO (:meth:`RtThreads.demote_all`). When npud's
link closes, its CPU watchdog is gone too: every thread at FIFO is lowered
(:meth:`RtThreads.npud_gone`) and asks the next npud again.
"""

from __future__ import annotations

import logging
import os
import resource
import threading
from collections.abc import Callable

from npumanager.clock import LoopClock
from npumanager.drivers.rt_policy import ASK, LOWER, RtPolicy
from npumanager.hal import rt_sched

log = logging.getLogger("npumanager.drivers.rt")

#: How long a thread lowered for a long run (or by SIGXCPU) waits before asking again.
BACKOFF_S = 1.0
#: RLIMIT_RTTIME's soft limit the host sets for itself, µs (hal/rt_sched.RTTIME_SOFT_US).
RTTIME_SOFT_US = rt_sched.RTTIME_SOFT_US


def set_rttime_soft(us: int = RTTIME_SOFT_US) -> bool:
    """The process's RLIMIT_RTTIME soft limit to ``us`` (never above the hard limit npud may
    have lowered); True if taken."""
    try:
        _soft, hard = resource.getrlimit(resource.RLIMIT_RTTIME)  # (npud's bound: cli/driver)
        want = us if hard == resource.RLIM_INFINITY else min(us, hard)
        resource.setrlimit(resource.RLIMIT_RTTIME, (want, hard))
    except (OSError, ValueError) as e:
        log.warning("RLIMIT_RTTIME not set (%s): a spinning FIFO thread is bounded by the "
                    "run bound and npud's hard limit only", e)
        return False
    return True


class RtThreads:
    """One host's burst threads at FIFO. ``ask(tid, priority)`` runs on the host's loop
    (handed there with ``call_soon``, which must be thread-safe) and sends the request to
    npud; burst threads call :meth:`serve`, :meth:`ran` and :meth:`closed`; the loop calls
    :meth:`applied` with npud's answer and :meth:`demote_all` on SIGXCPU."""

    def __init__(self, priority: int, max_run_us: int, clock: LoopClock,
                 call_soon: Callable[[Callable[[], None]], object],
                 ask: Callable[[int, int], bool], backoff_s: float = BACKOFF_S) -> None:
        self.priority = rt_sched.check_priority(priority)
        self.max_run_us = max_run_us
        self.backoff_s = backoff_s
        self._clock = clock
        self._call_soon = call_soon
        self._ask = ask
        self._lock = threading.Lock()
        self._threads: dict[int, RtPolicy] = {}
        #: npud refused for want of privilege (no CAP_SYS_NICE): asked no more.
        self.refused = ""
        #: Counts: granted by npud, refused by npud, lowered after a long run, lowered on
        #: SIGXCPU, lowered when npud's grant came after the thread stopped wanting it.
        self.granted = self.refusals = self.lowered_long = self.lowered_signal = 0
        self.lowered_late = self.lowered_gone = 0

    # --- burst threads ----------------------------------------------------------------

    def serve(self, policy: RtPolicy, foreground: bool) -> None:
        """The calling burst thread's steps now run here as FOREGROUND or BACKGROUND."""
        tid = threading.get_native_id()
        with self._lock:
            act = policy.serve(foreground, self._clock.now())
            if act == ASK:
                if self.refused:
                    policy.want = False
                    return
                self._threads[tid] = policy
        if act == ASK:
            self._call_soon(lambda: self._send(tid))
        elif act == LOWER:
            rt_sched.set_other(0)

    def ran(self, policy: RtPolicy, run_us: float) -> None:
        """The calling burst thread's run took ``run_us``: lowered if it was at FIFO
        longer than ``max_run_us``."""
        if not policy.want:
            return
        with self._lock:
            long = policy.ran(run_us, self.max_run_us, self._clock.now(), self.backoff_s)
        if long:
            rt_sched.set_other(0)
            self.lowered_long += 1
            log.debug("a FOREGROUND run at FIFO took %.0f µs (bound %d): lowered for %g s",
                      run_us, self.max_run_us, self.backoff_s)

    def closed(self, policy: RtPolicy) -> None:
        """The calling burst thread's burst ends: lowered, and forgotten."""
        with self._lock:
            self._threads.pop(threading.get_native_id(), None)
            was = policy.want
            policy.want = False
        if was:
            rt_sched.set_other(0)

    # --- the loop -----------------------------------------------------------------

    def _send(self, tid: int) -> None:
        with self._lock:
            policy = self._threads.get(tid)
            if policy is None or not policy.want:
                return  # (lowered again before the loop got to it)
        if not self._ask(tid, self.priority):
            with self._lock:  # no npud attached: asked again at the next change
                policy.want = False

    def applied(self, tid: int, ok: bool, why: str) -> None:
        """npud's answer to the request for ``tid``. A refusal backs the thread off like a
        long run (else a FOREGROUND stream would ask again at every frame while npud says
        no, e.g. while its host cools down after a watchdog demotion)."""
        with self._lock:
            policy = self._threads.get(tid)
            wanted = policy is not None and policy.want
            if not ok and policy is not None:
                policy.demoted(self._clock.now(), self.backoff_s)
        if ok:
            self.granted += 1
            # (it stopped wanting it, or its burst closed, meanwhile: lowered, if the id is
            # still our thread at FIFO, so a reused id's thread is left as it is)
            s = None if wanted else rt_sched.sched_of(tid)
            if (s is not None and s.fifo and rt_sched.is_thread_of(tid, os.getpid())
                    and rt_sched.set_other(tid).ok):
                self.lowered_late += 1
            return
        self.refusals += 1
        if "not permitted" in why or "off for" in why:
            if not self.refused:
                log.warning("npud cannot make burst threads SCHED_FIFO (%s): going on "
                            "without", why)
            self.refused = why
        else:
            log.info("npud refused SCHED_FIFO for thread %d: %s", tid, why)

    def demote_all(self) -> int:
        """Every thread of ours at FIFO lowered (SIGXCPU: one ran past RLIMIT_RTTIME's soft
        limit), none asking again for ``backoff_s``; how many were lowered."""
        now = self._clock.now()
        with self._lock:
            tids = list(self._threads.items())
            for _tid, policy in tids:
                policy.demoted(now, self.backoff_s)
        n = 0
        for tid, _policy in tids:
            s = rt_sched.sched_of(tid)
            if s is not None and s.fifo and rt_sched.set_other(tid).ok:
                n += 1
        self.lowered_signal += n
        return n

    def npud_gone(self) -> int:
        """npud's link closed (killed, crashed, or a restart): its CPU watchdog over our
        FIFO threads went with it, so each is lowered; it asks again at its next
        FOREGROUND step (no back-off), of the next npud to attach, which then watches it.
        How many were lowered."""
        with self._lock:
            tids = list(self._threads)
            for policy in self._threads.values():
                policy.want = False
        me, n = os.getpid(), 0
        for tid in tids:
            s = rt_sched.sched_of(tid)
            if (s is not None and s.fifo and rt_sched.is_thread_of(tid, me)
                    and rt_sched.set_other(tid).ok):
                n += 1
        self.lowered_gone += n
        return n

    def counts(self) -> dict[str, int]:
        with self._lock:
            at_fifo = sum(p.want for p in self._threads.values())
        return {"granted": self.granted, "refused": self.refusals,
                "lowered_long": self.lowered_long, "lowered_signal": self.lowered_signal,
                "lowered_late": self.lowered_late, "lowered_gone": self.lowered_gone,
                "wanted": at_fifo}
