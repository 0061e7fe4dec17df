"""npud's shell around :class:`~npumanager.service.rt_watch.RtWatch`: the
``set_thread_realtime`` call, the watchdog's sampling and the demotions.

Only root's npud can put a thread at SCHED_FIFO here (CAP_SYS_NICE; an app's hard
RLIMIT_RTPRIO is 0 and npud, lacking CAP_SYS_RESOURCE, cannot raise it), so npud applies
it to a thread id it has checked (hal/rt_sched.set_fifo, with the caller's pid: the
thread must be that process's before and after the call). The watchdog runs only while
a grant is live: every ``app_rt_sample_s`` it reads each granted thread's CPU time
(/proc/PID/task/TID/schedstat: a thread of another process reads as gone) and carries out
what the pure core decides. A demotion first re-reads whose the thread id is: one whose
process exited and whose id now names someone else's thread is forgotten, not touched.

If npud dies without stopping, its grants stay until their threads exit, and no watchdog
is left: so npud grants only to a process whose RLIMIT_RTTIME hard limit is at most
500 ms (:func:`_check_rttime`, from /proc/PID/limits), which the kernel enforces without
npud (SIGKILL to a process whose RT thread runs that long without blocking); the client
lowers its own limit before it asks, and with its soft limit (50 ms) its SIGXCPU handler
lowers the thread first (hal/rt_backstop.py). Every thread npud granted has
SCHED_RESET_ON_FORK (its children and new threads start normal).
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import TYPE_CHECKING

from npumanager.errors import InvalidArgument, PermissionDenied, RealtimeUnavailable
from npumanager.hal import rt_sched
from npumanager.proto.v1.manager_pb2 import RealtimeGrant
from npumanager.service.rt_privilege import refusal_cause
from npumanager.service.rt_watch import Demote, RtLimits, RtWatch

if TYPE_CHECKING:
    from npumanager.service.daemon import Daemon
    from npumanager.wire.conn import CallContext

log = logging.getLogger("npumanager.npud")


class AppRealtime:
    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon
        self.watch = RtWatch(RtLimits.from_section(daemon.cfg.section("manager")))
        self._task: asyncio.Task[None] | None = None
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return repr(self.watch)

    def request(self, ctx: CallContext, tid: int) -> RealtimeGrant:
        """``set_thread_realtime``: thread ``tid`` of the caller to SCHED_FIFO, or a typed
        refusal (rt_watch.RtWatch.check)."""
        client = self.d.clients[ctx.conn]
        peer = ctx.peer
        now = self.d.clock.now()
        owner = rt_sched.owner_of(tid) if tid > 0 else None
        lim = self.watch.limits
        grant = self.watch.check(
            now, uid=peer.uid, pid=peer.pid, key=client.key, conn=client.cid, tid=tid,
            owner=(owner.tgid, owner.uid) if owner is not None else None,
            importance=self.d.state.importance(client.key), npud_pid=self._pid)
        if grant.tid not in self.watch.grants:
            _check_rttime(peer.pid)
            got = rt_sched.set_fifo(tid, lim.priority, tgid=peer.pid)
            if not got.ok:
                if "not permitted" in got.why:
                    raise RealtimeUnavailable(f"the kernel refused SCHED_FIFO for thread "
                                              f"{tid} ({got.why}): {refusal_cause()}")
                if "not a thread of" in got.why or "left process" in got.why:
                    raise PermissionDenied(got.why)
                raise InvalidArgument(f"thread {tid}: {got.why}")
            self.watch.granted(grant, now, rt_sched.cpu_ns(tid, peer.pid))
            log.info("thread %d of pid %d (uid %d) at SCHED_FIFO %d", tid, peer.pid,
                     peer.uid, lim.priority)
            self._ensure_watchdog()
        return RealtimeGrant(priority=lim.priority, max_cpu_ms=lim.max_cpu_ms,
                             window_s=lim.window_s, max_threads=lim.max_threads)

    def conn_closed(self, cid: int) -> None:
        if self.watch.grants:
            self._carry_out(self.watch.conn_closed(cid))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._carry_out(self.watch.stop())

    def tick(self) -> None:
        """One watchdog sample (the loop's body; tests call it directly)."""
        cpu = {g.tid: rt_sched.cpu_ns(g.tid, g.pid) for g in self.watch.grants.values()}
        self._carry_out(self.watch.tick(self.d.clock.now(), cpu, self.d.state.importance))

    def _ensure_watchdog(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watchdog())

    async def _watchdog(self) -> None:
        while self.watch.grants:
            await self.d.clock.sleep(self.watch.limits.sample_s)
            try:
                self.tick()
            except Exception:
                log.exception("real-time watchdog tick failed")

    def _carry_out(self, demotes: list[Demote]) -> None:
        for dm in demotes:
            g = dm.grant
            owner = rt_sched.owner_of(g.tid)
            if owner is None or owner.tgid != g.pid or owner.uid != g.uid:
                log.info("real-time thread %d of pid %d ended (%s): gone, not touched",
                         g.tid, g.pid, dm.detail)
                continue
            got = rt_sched.set_other(g.tid)
            level = logging.WARNING if dm.why == "cpu" else logging.INFO
            log.log(level, "real-time thread %d of pid %d (uid %d) back to SCHED_OTHER: %s%s",
                    g.tid, g.pid, g.uid, dm.detail, "" if got.ok else f" (failed: {got.why})")


def _check_rttime(pid: int) -> None:
    """PermissionDenied unless process ``pid``'s RLIMIT_RTTIME hard limit is at most
    rt_sched.RTTIME_HARD_US: the bound on its FIFO threads that holds without npud (the
    kernel kills a process whose RT thread runs that long without blocking; no
    unprivileged process can raise the limit again). One /proc read, at a new grant."""
    limits = rt_sched.rttime_limits(pid)
    hard = None if limits is None else limits[1]
    if hard is not None and hard <= rt_sched.RTTIME_HARD_US:
        return
    now = ("unreadable" if limits is None else "unlimited" if hard is None
           else f"{hard} µs")
    raise PermissionDenied(
        f"process {pid}'s RLIMIT_RTTIME hard limit is {now}: npud grants real-time threads "
        f"only to a process that bounds them itself, at most {rt_sched.RTTIME_HARD_US} µs "
        "(the kernel then kills a thread that runs that long at SCHED_FIFO without "
        "blocking, also when npud is gone). Lower it before asking: "
        f"resource.setrlimit(resource.RLIMIT_RTTIME, ({rt_sched.RTTIME_SOFT_US}, "
        f"{rt_sched.RTTIME_HARD_US})) with a SIGXCPU handler that lowers the thread; "
        "npumanager's client does both (hal/rt_backstop.py)")
