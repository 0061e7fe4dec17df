"""An app's own bound on the threads npud puts at SCHED_FIFO for it, one that holds when
npud is gone.

npud's watchdog (service/rt_apps.py) takes back a granted thread that spins, but only
while npud runs: npud SIGKILLed or crashed leaves its grants at FIFO until their threads
exit. So the client bounds its own process before it asks (:func:`prepare`, called by
``NpuManager.set_thread_realtime``, ``AsyncNpuManager.set_thread_realtime`` and
``model.burst(realtime=True)``), as a driver host does for its burst threads
(drivers/rt_threads.py):

* RLIMIT_RTTIME's hard limit to at most 500 ms (rt_sched.RTTIME_HARD_US): the kernel kills
  the process (SIGKILL) whose thread runs that long at an RT policy without blocking. No
  unprivileged process can raise it again, and npud refuses a caller whose hard limit is
  above it (read from /proc/PID/limits, ``PermissionDenied``): so the bound holds for any
  client, this one or not, with npud or without.
* its soft limit to 50 ms (:data:`RTTIME_SOFT_US`), and a SIGXCPU handler that puts every
  thread of this process npud was asked for back to SCHED_OTHER (lowering one's own
  thread needs no privilege) and sets the soft limit again (the kernel raised it by 1 s
  when it sent the signal).

The handler is Python's: it runs on the main thread, between bytecodes. A thread other
than the main one that asks for itself blocks SIGXCPU (:func:`prepare`), so the kernel
delivers it to another thread, the main one first, waking it from a blocking call
(``join()``, a lock, an event loop) to run the handler. A main thread stuck in a C call
that is not interrupted, or a signal taken by another thread of the app, leaves the hard
limit as the bound.
Python installs a handler only from the main thread: until :func:`install` ran there
(``prepare`` does it when called there), the soft limit stays at the hard one and a
spinner is killed at 500 ms instead of lowered at 50 (logged once).

The clients also lower the threads a connection asked for when it ends (:func:`lower`:
npud killed or crashed, or the app closed it), as npud does at a connection's close: with
an honest client no thread stays at FIFO without npud's watchdog, whether it blocks now
and then or not; the limits above are what holds for one that does not.

A process that uses SIGXCPU itself (RLIMIT_CPU's signal) keeps its disposition: the
handler tells RLIMIT_RTTIME's signal by the soft limit the kernel raised, and passes any
other SIGXCPU on to what was there before (a Python handler is called; SIG_IGN ignores it;
SIG_DFL is restored and the signal sent again, so RLIMIT_CPU still ends the process). A
handler installed outside Python (``signal.getsignal`` returns None) cannot be chained:
the request is refused (``RealtimeUnavailable``) rather than replace it silently. An app
that replaces the handler after a grant (or sets SIGXCPU back to SIG_DFL) gets what it
asked for: the soft limit's SIGXCPU goes to its own handler (SIG_DFL: the process ends).
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import threading
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

from npumanager.errors import RealtimeUnavailable
from npumanager.hal import rt_sched
from npumanager.words import plural

log = logging.getLogger("npumanager.rt")

#: RLIMIT_RTTIME's soft limit set (µs): the host's, 50 ms.
RTTIME_SOFT_US = rt_sched.RTTIME_SOFT_US

_lock = threading.Lock()
#: Thread ids of this process npud was asked to put at FIFO (the handler lowers these).
_asked: set[int] = set()
#: What SIGXCPU did before :func:`install` (None: not installed).
_previous: Any = None
_installed = False
#: The soft limit :func:`install` set (the handler compares the current one with it).
_soft = 0
_warned = False
#: Counts: SIGXCPUs of RLIMIT_RTTIME handled, threads lowered by them, others passed on,
#: threads lowered when the connection that asked for them ended (:func:`lower`).
counts = {"signals": 0, "lowered": 0, "passed_on": 0, "lowered_gone": 0}


def _rttime() -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_RTTIME)
    return soft, hard


def _want_soft() -> int:
    """The soft limit to keep: 50 ms, or lower if the app set one lower, never above the
    hard limit."""
    soft, hard = _rttime()
    want = RTTIME_SOFT_US if hard == resource.RLIM_INFINITY else min(RTTIME_SOFT_US, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        want = soft
    return want


def install() -> str:
    """The SIGXCPU handler and the 50 ms soft limit, if this is the main thread (Python's
    rule for signal handlers); '' when installed (or already), else why not. Raises
    RealtimeUnavailable for a SIGXCPU handler it cannot chain to (one installed outside
    Python)."""
    global _previous, _installed, _soft
    with _lock:
        on_main = threading.current_thread() is threading.main_thread()
        if _installed and (not on_main or signal.getsignal(signal.SIGXCPU) is _on_sigxcpu):
            return ""
        # (installed, and the app put a handler of its own since: chained in its turn)
        if not on_main:
            return "not on the main thread (Python installs signal handlers there only)"
        why = rt_sched.bound_own_rttime()
        if why:
            raise RealtimeUnavailable(f"this process cannot bound its real-time threads: {why}")
        prev = signal.getsignal(signal.SIGXCPU)
        if prev is None:
            raise RealtimeUnavailable(
                "SIGXCPU has a handler installed outside Python, which npumanager cannot "
                "chain to: its real-time backstop (RLIMIT_RTTIME's soft limit, whose "
                "SIGXCPU lowers the granted threads) would replace it. Install a Python "
                "handler for SIGXCPU instead (npumanager calls it for every SIGXCPU that "
                "is not RLIMIT_RTTIME's), or do without real-time threads")
        _previous = prev
        signal.signal(signal.SIGXCPU, _on_sigxcpu)
        _soft = _want_soft()
        _, hard = _rttime()
        resource.setrlimit(resource.RLIMIT_RTTIME, (_soft, hard))
        _installed = True
        return ""


def prepare(tid: int) -> None:
    """Before asking npud for thread ``tid`` of this process: the hard limit at most
    500 ms, the handler and soft limit where :func:`install` can (else logged once, the
    hard limit the bound), and ``tid`` among the threads the handler lowers. Raises
    RealtimeUnavailable when the process cannot be bounded."""
    global _warned
    why = install()
    with _lock:
        if not _installed:
            bound = rt_sched.bound_own_rttime()
            if bound:
                raise RealtimeUnavailable(
                    f"this process cannot bound its real-time threads: {bound}")
            soft, hard = _rttime()
            if soft < hard and signal.getsignal(signal.SIGXCPU) == signal.SIG_DFL:
                # (no handler: SIGXCPU at a soft limit would end the process)
                resource.setrlimit(resource.RLIMIT_RTTIME, (hard, hard))
            if not _warned:
                _warned = True
                log.warning("SIGXCPU handler not installed (%s): a thread at SCHED_FIFO that "
                            "runs %d ms without blocking kills this process instead of "
                            "being lowered after %d ms; call npumanager.hal.rt_backstop."
                            "install() from the main thread first", why,
                            rt_sched.RTTIME_HARD_US // 1000, RTTIME_SOFT_US // 1000)
        _asked.add(tid)
    if (_installed and tid == threading.get_native_id()
            and threading.current_thread() is not threading.main_thread()):
        # The kernel sends RLIMIT_RTTIME's SIGXCPU to the spinning thread itself unless it
        # blocks it; blocked here, it goes to another thread, the main one first, which
        # it wakes from a blocking call (join, a lock, an event loop) to run the handler.
        # Measured (same run, 3 each): a worker spinning at FIFO while the main thread
        # waits in join() or asyncio is lowered after 54-59 ms of CPU; unblocked, the
        # process is killed at the hard limit (join) or lowered only at 500 ms (asyncio,
        # woken by its own 0.5 s timer).
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGXCPU})


def refused(tid: int) -> None:
    """npud refused ``tid`` (or the call failed): no longer ours to lower, unless it is
    at FIFO from an earlier grant."""
    s = rt_sched.sched_of(tid) if tid > 0 else None
    if s is None or not s.fifo:
        with _lock:
            _asked.discard(tid)


def lower_all() -> int:
    """Every thread npud was asked for that is still this process's and at FIFO, back
    to SCHED_OTHER; how many. (Threads gone are forgotten.)"""
    me = os.getpid()
    n = 0
    for tid in list(_asked):  # (a copy: no lock in a signal handler's path)
        s = rt_sched.sched_of(tid)
        if s is None or not rt_sched.is_thread_of(tid, me):
            _asked.discard(tid)
            continue
        if s.policy in (os.SCHED_FIFO, os.SCHED_RR) and rt_sched.set_other(tid).ok:
            n += 1
    return n


def lower(tids: Iterable[int]) -> int:
    """The connection that asked for ``tids`` ended (npud gone, or closed here): no npud
    watches them now, so each that is still this process's and at an RT policy goes back
    to SCHED_OTHER, as npud does at a connection's close; how many."""
    me, n = os.getpid(), 0
    for tid in list(tids):
        with _lock:
            _asked.discard(tid)
        s = rt_sched.sched_of(tid)
        if (s is not None and s.policy in (os.SCHED_FIFO, os.SCHED_RR)
                and rt_sched.is_thread_of(tid, me) and rt_sched.set_other(tid).ok):
            n += 1
    counts["lowered_gone"] += n
    return n


def _on_sigxcpu(signum: int, frame: FrameType | None) -> None:
    soft, hard = _rttime()
    if soft != _soft:
        # RLIMIT_RTTIME's: the kernel raised the soft limit by a second as it sent it.
        counts["signals"] += 1
        n = lower_all()
        counts["lowered"] += n
        resource.setrlimit(resource.RLIMIT_RTTIME, (min(_soft, hard), hard))
        log.warning("SIGXCPU: a thread at SCHED_FIFO ran %d ms without blocking; %s of "
                    "this process back to SCHED_OTHER", _soft // 1000, plural(n, "thread"))
        return
    counts["passed_on"] += 1
    _pass_on(signum, frame)


def _pass_on(signum: int, frame: FrameType | None) -> None:
    """A SIGXCPU that is not RLIMIT_RTTIME's (RLIMIT_CPU's, or sent): what the process
    did with it before."""
    prev = _previous
    if prev == signal.SIG_IGN:
        return
    if prev == signal.SIG_DFL or prev is None:
        signal.signal(signal.SIGXCPU, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGXCPU)  # (the default: the process ends)
        return
    handler: Callable[[int, FrameType | None], Any] = prev
    handler(signum, frame)


def _after_fork_in_child() -> None:
    # (the child has one thread, none of them granted; the handler and limits stay)
    _asked.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
