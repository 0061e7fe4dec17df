"""npud's grant of SCHED_FIFO to a driver host's threads (service/host_rt.py) against a
hostile host, under real uids: a stand-in host process runs as the driver's user (as the
real host does once it gave up root), and the test plays npud (root) with npud's own
code. Only the host's own threads get FIFO, never another uid's or npud's, at most
MAX_THREADS at once, only for a host bounded by RLIMIT_RTTIME; a thread that spins at
FIFO is lowered by the host's SIGXCPU handler within the soft limit, a host that
ignores SIGXCPU is killed at the hard one, and a thread that blocks now and then (which
restarts RLIMIT_RTTIME's count) is lowered by npud's CPU watchdog within its budget."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from npumanager.cli.driver import rt_backstop
from npumanager.clock import MonotonicClock
from npumanager.drivers.rt_policy import RtPolicy
from npumanager.drivers.rt_threads import RTTIME_SOFT_US, RtThreads
from npumanager.hal import rt_sched as rt
from npumanager.service.host_rt import MAX_THREADS, HostRtGrants
from npumanager.service.host_rt_watch import MAX_CPU_MS
from npumanager.testing import procs
from npumanager.testing.clock import VirtualClock
from tests.hal.test_rt_sched import Parked, needs_fifo
from tests.security.harness import ATTACKER, needs_root
from tests.security.test_driver_user import expected_user

pytestmark = [needs_root, needs_fifo, pytest.mark.fifo]
DRIVER_USER = expected_user().pw_uid


def stand_in_host(threads: int, bounded: bool) -> None:
    """A host as npud starts one: RLIMIT_RTTIME's hard limit lowered while root (unless not
    ``bounded``), then the driver's user (when started as root); ``threads`` parked threads
    announced; then it lowers the threads the test names, until told to stop."""
    if bounded:
        assert rt.bound_own_rttime() == ""
    if os.getuid() == 0:
        os.setgroups([])
        os.setgid(expected_user().pw_gid)
        os.setuid(DRIVER_USER)
    stop = threading.Event()
    tids: list[int] = []
    lock = threading.Lock()

    def park() -> None:
        with lock:
            tids.append(threading.get_native_id())
        stop.wait(60)

    ts = [threading.Thread(target=park) for _ in range(threads)]
    for t in ts:
        t.start()
    while len(tids) < threads:
        time.sleep(0.01)
    procs.announce(("tids", sorted(tids)))
    while (msg := procs.receive(60)) != "stop":
        procs.announce(("lowered", msg, rt.set_other(msg).ok))
    stop.set()
    for t in ts:
        t.join(10)


@pytest.fixture
def host() -> Iterator[tuple[procs.Child, list[int]]]:
    child = procs.spawn_as(None, None, stand_in_host, MAX_THREADS + 2, True, timeout=120)
    try:
        _, tids = child.expect(lambda e: e[0] == "tids")
        yield child, tids
        child.send("stop")
        child.wait(30)
    finally:
        child.kill()


def test_the_hosts_own_thread_gets_fifo_and_nothing_else_does(
        host: tuple[procs.Child, list[int]]) -> None:
    child, tids = host
    grants = HostRtGrants(MonotonicClock())
    got = grants.grant(child.pid, tids[0], 1, 1)
    assert got.ok, got.why
    assert rt.sched_of(tids[0]) == rt.ThreadSched(os.SCHED_FIFO, 1, True)
    assert rt.owner_of(tids[0]) == rt.ThreadOwner(child.pid, DRIVER_USER)
    # Another uid's thread, npud's own (this process, root), pid 1's: refused, untouched.
    victim = procs.spawn_as(ATTACKER, None, stand_in_host, 1, False)
    npud_thread = Parked()
    try:
        _, (other,) = victim.expect(lambda e: e[0] == "tids")
        for tid in (other, victim.pid, npud_thread.tid, os.getpid(), 1):
            no = grants.grant(child.pid, tid, 1, 1)
            assert not no.ok and "not a thread of host process" in no.why, (tid, no)
            s = rt.sched_of(tid)
            assert s is not None and not s.fifo
        victim.send("stop")
        victim.wait(30)
    finally:
        victim.kill()
        npud_thread.end()
    # Not this driver's priority, the key off, an adopted host: refused.
    assert "not this driver's" in grants.grant(child.pid, tids[1], 5, 1).why
    assert "off for this driver" in grants.grant(child.pid, tids[1], 1, 0).why
    assert "not a host this npud started" in grants.grant(None, tids[1], 1, 1).why
    assert rt.sched_of(tids[1]) == rt.ThreadSched(os.SCHED_OTHER, 0, False)
    # A priority outside 1..10 never reaches the kernel.
    assert not grants.grant(child.pid, tids[1], 50, 50).ok


def test_at_most_max_threads_at_once_and_a_lowered_one_frees_its_place(
        host: tuple[procs.Child, list[int]]) -> None:
    child, tids = host
    grants = HostRtGrants(MonotonicClock())
    for tid in tids[:MAX_THREADS]:
        assert grants.grant(child.pid, tid, 1, 1).ok
    over = grants.grant(child.pid, tids[MAX_THREADS], 1, 1)
    assert not over.ok and f"at most {MAX_THREADS}" in over.why
    assert not rt.sched_of(tids[MAX_THREADS]).fifo  # type: ignore[union-attr]
    assert grants.grant(child.pid, tids[0], 1, 1).ok  # (one it has: asked again, fine)
    child.send(tids[0])  # the host lowers one of its own (no privilege needed)
    assert child.expect(lambda e: e[0] == "lowered")[2]
    assert grants.grant(child.pid, tids[MAX_THREADS], 1, 1).ok
    assert len(grants.at_fifo(child.pid)) == MAX_THREADS


def test_a_thread_gone_or_a_host_without_the_rttime_bound_gets_nothing() -> None:
    grants = HostRtGrants(MonotonicClock())
    child = procs.spawn_as(None, None, stand_in_host, 1, False)
    try:
        _, (tid,) = child.expect(lambda e: e[0] == "tids")
        assert rt.rttime_limits(child.pid) == (None, None)
        no = grants.grant(child.pid, tid, 1, 1)
        assert not no.ok and "RLIMIT_RTTIME hard limit is unlimited" in no.why
        child.send("stop")
        child.wait(30)
    finally:
        child.kill()
    gone = grants.grant(child.pid, tid, 1, 1)
    assert not gone.ok and "not a thread of host process" in gone.why


def spinning_host(ignore_sigxcpu: bool) -> dict[str, Any]:
    """A host whose burst thread spins at FIFO once npud made it so: with the host's own
    backstop (cli/driver.rt_backstop: RLIMIT_RTTIME's soft limit, SIGXCPU handled on its
    event loop), or ignoring SIGXCPU."""
    assert rt.bound_own_rttime() == ""
    os.setgroups([])
    os.setgid(expected_user().pw_gid)
    os.setuid(DRIVER_USER)
    rts = RtThreads(1, 5000, VirtualClock(), lambda fn: None, lambda tid, p: True)
    fired: list[int] = []
    real_demote = rts.demote_all

    def demote_all() -> int:
        n = real_demote()
        fired.append(n)
        return n

    rts.demote_all = demote_all  # type: ignore[method-assign]
    out: dict[str, Any] = {}

    def burst() -> None:
        p = RtPolicy()
        rts.serve(p, True)  # (registers the thread; the test applies FIFO as npud)
        procs.announce(("tid", threading.get_native_id()))
        while not (s := rt.sched_of(0)) or not s.fifo:
            time.sleep(0.001)
        t0 = rt.cpu_ns(0) or 0
        while (s := rt.sched_of(0)) is not None and s.fifo:
            if (rt.cpu_ns(0) or 0) - t0 > 2_000_000_000:
                break
        out["fifo_cpu_ms"] = ((rt.cpu_ns(0) or 0) - t0) / 1e6
        out["policy_after"] = rt.sched_of(0)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        rt_backstop([SimpleNamespace(rt=rts)], loop)  # type: ignore[list-item]
        ended = loop.create_future()

        def run() -> None:
            burst()
            loop.call_soon_threadsafe(ended.set_result, None)

        # The loop waits in epoll, off the GIL, as the host's does between events: the
        # spinning thread never waits for the GIL (a wait is a sleep, which restarts
        # RLIMIT_RTTIME's count) until SIGXCPU wakes the loop.
        threading.Thread(target=run).start()
        await ended

    if ignore_sigxcpu:
        # (the main thread blocked, off the GIL: the spinning thread never waits for it,
        # and a wait would be a sleep, which restarts RLIMIT_RTTIME's count)
        signal.signal(signal.SIGXCPU, signal.SIG_IGN)
        t = threading.Thread(target=burst)
        t.start()
        t.join(30)
    else:
        asyncio.run(main())
    out["fired"] = fired
    out["limits"] = rt.rttime_limits(os.getpid())
    return out


def test_a_spinning_fifo_thread_is_lowered_by_sigxcpu_within_the_soft_limit() -> None:
    child = procs.spawn_as(None, None, spinning_host, False, timeout=60)
    try:
        _, tid = child.expect(lambda e: e[0] == "tid")
        assert HostRtGrants(MonotonicClock()).grant(child.pid, tid, 1, 1).ok
        out = child.wait(30)
    finally:
        child.kill()
    print("CPU at FIFO before SIGXCPU lowered it:", out["fifo_cpu_ms"], "ms")
    assert out["policy_after"] == rt.ThreadSched(os.SCHED_OTHER, 0, True)
    assert out["fired"] and out["fired"][0] == 1
    assert out["limits"] == (RTTIME_SOFT_US, rt.RTTIME_HARD_US)
    # Lowered after RLIMIT_RTTIME's soft limit of CPU at FIFO without blocking, and before
    # the hard limit that would have killed the host (alone: 50-60 ms).
    assert RTTIME_SOFT_US / 1000 * 0.9 <= out["fifo_cpu_ms"] < rt.RTTIME_HARD_US / 1000


def test_a_host_that_ignores_sigxcpu_is_killed_at_the_hard_limit() -> None:
    child = procs.spawn_as(None, None, spinning_host, True, timeout=60)
    try:
        _, tid = child.expect(lambda e: e[0] == "tid")
        t0 = time.monotonic()
        assert HostRtGrants(MonotonicClock()).grant(child.pid, tid, 1, 1).ok
        with pytest.raises(procs.ChildFailed):
            child.wait(30)
        took = time.monotonic() - t0
    finally:
        child.kill()
    assert child.exit_status is not None and os.WIFSIGNALED(child.exit_status)
    assert os.WTERMSIG(child.exit_status) == signal.SIGKILL
    assert took >= rt.RTTIME_HARD_US / 1e6 * 0.9


def sleepy_spinner() -> dict[str, Any]:
    """A host whose thread, once at FIFO, spins 2 ms of CPU at a time with a 0.1 ms sleep
    between (each sleep restarts RLIMIT_RTTIME's count: SIGXCPU never comes)."""
    assert rt.bound_own_rttime() == ""
    os.setgroups([])
    os.setgid(expected_user().pw_gid)
    os.setuid(DRIVER_USER)
    out: dict[str, Any] = {}

    def burst() -> None:
        procs.announce(("tid", threading.get_native_id()))
        while not (s := rt.sched_of(0)) or not s.fifo:
            time.sleep(0.001)
        t0 = rt.cpu_ns(0) or 0
        while (s := rt.sched_of(0)) is not None and s.fifo:
            if (rt.cpu_ns(0) or 0) - t0 > 3_000_000_000:
                break
            start = rt.cpu_ns(0) or 0
            while (rt.cpu_ns(0) or 0) - start < 2_000_000:
                pass
            time.sleep(0.0001)
        out["fifo_cpu_ms"] = ((rt.cpu_ns(0) or 0) - t0) / 1e6
        out["policy_after"] = rt.sched_of(0)

    t = threading.Thread(target=burst)  # (the main thread blocked, off the GIL)
    t.start()
    t.join(30)
    return out


def test_a_thread_that_blocks_now_and_then_is_demoted_by_npuds_cpu_watchdog() -> None:
    child = procs.spawn_as(None, None, sleepy_spinner, timeout=60)
    try:
        _, tid = child.expect(lambda e: e[0] == "tid")

        async def npud() -> tuple[list[tuple[int, int]], str]:
            grants = HostRtGrants(MonotonicClock())
            got = grants.grant(child.pid, tid, 1, 1)
            assert got.ok, got.why
            try:
                while grants.watch.watched():
                    await asyncio.sleep(0.02)
                again = grants.grant(child.pid, tid, 1, 1)
                return [(child.pid, tid)] * grants.watch.demoted, again.why
            finally:
                grants.stop()

        demoted, again = asyncio.run(npud())
        out = child.wait(30)
    finally:
        child.kill()
    print("CPU at FIFO before npud's watchdog lowered it:", out["fifo_cpu_ms"], "ms")
    assert demoted == [(child.pid, tid)]
    assert "cooling down" in again
    assert out["policy_after"] == rt.ThreadSched(os.SCHED_OTHER, 0, True)
    # The budget (200 ms in any second) plus about one sampling period (150 ms); slack
    # for the sampler's own wait for a CPU on a busy machine.
    assert MAX_CPU_MS * 0.9 <= out["fifo_cpu_ms"] < MAX_CPU_MS + 400
