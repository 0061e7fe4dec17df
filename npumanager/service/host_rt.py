"""npud's side of a driver host's burst threads at SCHED_FIFO (``[[driver]]
foreground_rt_priority``; bench/README.md: "Real-time foreground threads").

The host runs as the unprivileged ``driver_user`` and cannot enter SCHED_FIFO itself; it
asks (``hal.request_rt``, a push on the link npud opened to it) and npud applies it here,
to a thread it has checked, and answers (``hal.rt_applied``). What npud checks:

* the driver's config has the key on, and the priority asked for is the configured one;
* the host is a process this npud started (its pid from the spawn) and has not exited,
  or one it adopted after a restart that it can tie to the records of the npud that
  started it (service/host_records.py: that npud's root-owned record of the pid, the
  same process by its start time, so a recycled pid is refused, running as the driver's
  user; checked again at each grant), or one started by hand that it ties to its
  socket's listener (service/hand_ties.py: that exact process, by SO_PEERPIDFD, running
  as root, which alone may bind in npud's drivers dir). The socket's peer credentials
  alone are not enough: they name whichever process last listened on it, which a host
  could hand to any process of its user, and a pid that may have been reused since;
* the thread id is a thread of that process, checked before and after the call
  (hal/rt_sched.set_fifo with ``tgid``), so no other process's thread, npud's included;
* at most ``MAX_THREADS`` of that process's threads are at FIFO at once (threads gone or
  lowered since are not counted).

* the host process's RLIMIT_RTTIME hard limit is at most hal/rt_sched.RTTIME_HARD_US
  (500 ms), a bound it cannot lift: the host lowers it itself before it gives up root
  (cli/driver.py; npud cannot prlimit another uid's process without CAP_SYS_RESOURCE,
  which root lacks here), so a host thread that runs that long at FIFO without blocking
  is killed by the kernel (SIGKILL; npud restarts the host as after any crash).

* the host is not cooling down: npud samples every thread it granted (service/
  host_rt_watch.py) and demotes one that used more than 200 ms of CPU in the last second
  (a thread that blocks now and then escapes RLIMIT_RTTIME, whose count restarts at each
  block); its host then gets no grant for 10 s.

The host's own bounds come well before: a run longer than ``foreground_rt_max_run_us``
lowers the thread, and RLIMIT_RTTIME's soft limit (50 ms) sends SIGXCPU, on which it
lowers every FIFO thread it has (drivers/rt_threads.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from npumanager.clock import LoopClock
from npumanager.fds import close_fds
from npumanager.hal import rt_sched, rt_wire
from npumanager.hal.rt_sched import RtSet
from npumanager.service.host_rt_watch import MAX_CPU_MS, SAMPLE_S, WINDOW_S, HostRtWatch
from npumanager.service.rt_privilege import refusal_cause
from npumanager.wire.conn import CallContext

log = logging.getLogger("npumanager.service.host_rt")

#: A host's threads at FIFO at once (one per FOREGROUND burst being served).
MAX_THREADS = 8


class HostRtGrants:
    """The FIFO threads npud granted, per host process."""

    def __init__(self, clock: LoopClock, watch: HostRtWatch | None = None,
                 sample_s: float = SAMPLE_S) -> None:
        self._clock = clock
        self._granted: dict[int, set[int]] = {}
        self._warned = False
        self.granted = self.refused = 0
        #: The CPU each granted thread uses, sampled every ``sample_s`` while any is.
        self.watch = watch or HostRtWatch()
        self._sample_s = sample_s
        self._task: asyncio.Task[None] | None = None

    def grant(self, pid: int | str | None, tid: int, priority: int, configured: int
              ) -> RtSet:
        """Put host process ``pid``'s thread ``tid`` at FIFO ``priority`` if every check
        holds (``configured``: the driver's foreground_rt_priority; ``pid`` a str: why
        there is no host process to grant to)."""
        got = self._grant(pid, tid, priority, configured)
        if got.ok:
            self.granted += 1
        else:
            self.refused += 1
            if "not permitted" in got.why and not self._warned:
                self._warned = True
                log.warning("cannot put driver hosts' burst threads at SCHED_FIFO (%s): "
                            "%s; they go on without", got.why, refusal_cause())
        return got

    def _grant(self, pid: int | str | None, tid: int, priority: int, configured: int
               ) -> RtSet:
        if configured <= 0:
            return RtSet(False, "foreground_rt_priority is off for this driver")
        if not rt_sched.MIN_PRIORITY <= priority <= rt_sched.MAX_PRIORITY:
            return RtSet(False, f"priority {priority} is outside {rt_sched.MIN_PRIORITY}.."
                                f"{rt_sched.MAX_PRIORITY}")
        if priority != configured:
            return RtSet(False, f"priority {priority} is not this driver's "
                                f"foreground_rt_priority ({configured})")
        if pid is None or isinstance(pid, str):
            return RtSet(False, pid or "not a host this npud started or adopted")
        now = self._clock.now()
        if self.watch.cooling(pid, now):
            return RtSet(False, f"host process {pid} is cooling down: a thread of it used "
                                f"more than {MAX_CPU_MS:g} ms of CPU at SCHED_FIFO in "
                                f"{WINDOW_S:g} s")
        if tid <= 0 or not rt_sched.is_thread_of(tid, pid):
            return RtSet(False, f"thread {tid} is not a thread of host process {pid}")
        self._prune()
        mine = self._granted.setdefault(pid, set())
        if tid not in mine and len(mine) >= MAX_THREADS:
            return RtSet(False, f"host process {pid} has {len(mine)} threads at SCHED_FIFO "
                                f"already (at most {MAX_THREADS})")
        limits = rt_sched.rttime_limits(pid)
        hard = None if limits is None else limits[1]
        if hard is None or hard > rt_sched.RTTIME_HARD_US:
            return RtSet(False, f"host process {pid}'s RLIMIT_RTTIME hard limit is "
                                f"{'unlimited' if hard is None else hard} µs, not at most "
                                f"{rt_sched.RTTIME_HARD_US}")
        got = rt_sched.set_fifo(tid, priority, tgid=pid)
        if got.ok:
            if tid not in mine:
                self.watch.granted(pid, tid, now, rt_sched.cpu_ns(tid, pid) or 0)
            mine.add(tid)
            self._ensure_watchdog()
        return got

    def tick(self) -> list[tuple[int, int]]:
        """One watchdog sample: each granted thread's CPU time; the threads that used more
        than their budget back to SCHED_OTHER (one whose id no longer names that host's
        thread is left alone). Returns those demoted."""
        cpu: dict[tuple[int, int], int | None] = {}
        for pid, tid in self.watch.watched():
            s = rt_sched.sched_of(tid)
            cpu[(pid, tid)] = (rt_sched.cpu_ns(tid, pid) if s is not None and s.fifo
                               and rt_sched.is_thread_of(tid, pid) else None)
        out = self.watch.tick(self._clock.now(), cpu)
        for pid, tid in out:
            self._granted.get(pid, set()).discard(tid)
            if rt_sched.is_thread_of(tid, pid):
                got = rt_sched.set_other(tid)
                log.warning("driver host %d's thread %d used more than %g ms of CPU at "
                            "SCHED_FIFO in %g s: back to SCHED_OTHER%s; no grant to that "
                            "host for %g s", pid, tid, MAX_CPU_MS, WINDOW_S,
                            "" if got.ok else f" (failed: {got.why})",
                            self.watch.cooldown_s)
        return out

    def _ensure_watchdog(self) -> None:
        if self._task is None or self._task.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # (a grant made off any loop, as a test does: :meth:`tick` by hand)
            self._task = loop.create_task(self._watchdog())

    async def _watchdog(self) -> None:
        while self.watch.watched():
            await self._clock.sleep(self._sample_s)
            try:
                self.tick()
            except Exception:
                log.exception("driver hosts' real-time watchdog tick failed")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def _prune(self) -> None:
        """Forget threads gone, lowered, or no longer their process's; and empty hosts."""
        for pid, tids in list(self._granted.items()):
            for tid in list(tids):
                s = rt_sched.sched_of(tid)
                if s is None or not s.fifo or not rt_sched.is_thread_of(tid, pid):
                    tids.discard(tid)
            if not tids:
                del self._granted[pid]

    def at_fifo(self, pid: int) -> set[int]:
        """Host ``pid``'s threads npud granted FIFO that still have it."""
        self._prune()
        return set(self._granted.get(pid, ()))

    def handler(self, pid_of: Callable[[], int | str], configured: int
                ) -> Callable[[CallContext, bytes], None]:
        """The ``hal.request_rt`` handler of one driver's link: ``pid_of()`` is the pid of
        the host process npud started for it or adopted and tied to its records (a str:
        why there is none to grant to)."""

        def on_request(ctx: CallContext, payload: bytes) -> None:
            close_fds(ctx.fds)
            try:
                tid, priority = rt_wire.decode_request(payload)
            except ValueError as e:
                log.warning("driver host sent a bad %s: %s", rt_wire.REQUEST, e)
                return
            got = self.grant(pid_of(), tid, priority, configured)
            if not ctx.conn.closed:
                ctx.conn.push(rt_wire.APPLIED, rt_wire.encode_applied(tid, got.ok, got.why))

        return on_request

