"""Real-time grants to a driver host that a restarted npud adopted (service/host_records.py,
service/host_rt.py), against a hostile host, under real uids. The test plays both npuds
(root) with npud's code: the first writes its record of the host it started (in a
root-owned dir, as RT/drivers), the second ties the host it adopts to that record and
grants through the same path as npud's handler. A host tied to the record gets its
thread at FIFO and stays under npud's CPU watchdog; a process at a recycled pid (made
for the test with ns_last_pid), one that is not the recorded host (another process of
the driver's user that took over the socket), or one not running as the driver's user
gets nothing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from npumanager.clock import MonotonicClock
from npumanager.hal import rt_sched as rt
from npumanager.service import host_records as hr
from npumanager.service.host_rt import HostRtGrants
from npumanager.testing import procs
from tests.hal.test_rt_sched import needs_fifo
from tests.security.harness import ATTACKER, needs_root
from tests.security.test_host_rt_grants import DRIVER_USER, sleepy_spinner, stand_in_host

pytestmark = [needs_root, needs_fifo, pytest.mark.fifo]


@pytest.fixture
def drivers_dir(tmp_path: Path) -> Path:
    d = tmp_path / "drivers"
    d.mkdir(mode=0o755)
    return d


def _host(uid: int | None = None) -> tuple[procs.Child, list[int]]:
    """A stand-in host (bounded RLIMIT_RTTIME, the driver's user unless ``uid``)."""
    if uid is None:
        child = procs.spawn_as(None, None, stand_in_host, 2, True, timeout=120)
    else:  # (bounded as root first would need the stand-in's own switch: not needed)
        child = procs.spawn_as(uid, None, stand_in_host, 2, False, timeout=120)
    _, tids = child.expect(lambda e: e[0] == "tids")
    return child, tids


def _stop(child: procs.Child) -> None:
    with contextlib.suppress(Exception):
        child.send("stop")
        child.wait(30)
    child.kill()


def _grant(rec: hr.HostRecord | str, pid: int, tid: int) -> rt.RtSet:
    """What npud's hal.request_rt handler does for an adopted host's thread."""
    return HostRtGrants(MonotonicClock()).grant(hr.grantable(rec, pid), tid, 1, 1)


def test_an_adopted_host_tied_to_npuds_record_gets_its_thread_at_fifo(
        drivers_dir: Path) -> None:
    path = hr.record_path(drivers_dir / "reference.sock")
    child, tids = _host()
    try:
        assert hr.write(path, child.pid, DRIVER_USER) == ""  # the first npud, at spawn
        rec = hr.adopt(path, child.pid, DRIVER_USER)  # the second, at adoption
        assert isinstance(rec, hr.HostRecord), rec
        got = _grant(rec, child.pid, tids[0])
        assert got.ok, got.why
        assert rt.sched_of(tids[0]) == rt.ThreadSched(os.SCHED_FIFO, 1, True)
        # Every other check holds as for a host npud started: another process's thread.
        no = _grant(rec, child.pid, os.getpid())
        assert not no.ok and "not a thread of host process" in no.why
    finally:
        _stop(child)
    # The host gone: its record ties nothing.
    no = _grant(rec, child.pid, tids[1])
    assert not no.ok and "has exited" in no.why, no.why


def _spawn_at(pid: int, tries: int = 200, uid: int | None = None,
              fn: Callable[..., None] | None = None) -> tuple[procs.Child, list[int]] | None:
    """A stand-in host (the driver's user, bounded: the impostor npud would most easily
    take for the real one) at exactly ``pid``, by setting the kernel's last pid; or
    ``fn`` run as ``uid`` (None: root), announcing ``("tids", [...])`` as the host does."""
    # /proc start times count clock ticks (10 ms): a pid taken again within the tick its
    # first process started in reads as the same process. Only root's ns_last_pid recycles
    # a pid that fast (a wrap of the pid space takes far longer); this test's did once on
    # an idle machine, so the impostor starts a few ticks later, as any real one would.
    time.sleep(3 / os.sysconf("SC_CLK_TCK"))
    for _ in range(tries):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        child = (procs.spawn_as(None, None, stand_in_host, 1, True, timeout=120)
                 if fn is None else procs.spawn_as(uid, uid, fn, timeout=120))
        if child.pid == pid:
            _, tids = child.expect(lambda e: e[0] == "tids")
            return child, tids
        child.kill()
        with contextlib.suppress(Exception):
            child.wait(5)
    return None


def test_a_recycled_pid_is_refused(drivers_dir: Path) -> None:
    path = hr.record_path(drivers_dir / "reference.sock")
    first, _ = _host()
    pid = first.pid
    try:
        assert hr.write(path, pid, DRIVER_USER) == ""
    finally:
        _stop(first)
    again = _spawn_at(pid)
    if again is None:
        pytest.skip(f"could not get pid {pid} again (other processes took it first)")
    impostor, (tid,) = again
    try:
        assert hr.uids_of(pid) == (DRIVER_USER,) * 4  # same pid, same user, bounded
        rec = hr.adopt(path, pid, DRIVER_USER)
        assert isinstance(rec, str) and "recycled pid" in rec, rec
        no = _grant(rec, pid, tid)
        assert not no.ok and "recycled pid" in no.why, no.why
        assert not rt.sched_of(tid).fifo  # type: ignore[union-attr]
    finally:
        _stop(impostor)


def test_a_process_that_is_not_the_recorded_host_is_refused(drivers_dir: Path) -> None:
    path = hr.record_path(drivers_dir / "reference.sock")
    host, _ = _host()
    other, other_tids = _host()  # the driver's user too: it took over the socket
    stranger, stranger_tids = _host(ATTACKER)
    try:
        assert hr.write(path, host.pid, DRIVER_USER) == ""
        for p, tid in ((other.pid, other_tids[0]), (stranger.pid, stranger_tids[0])):
            rec = hr.adopt(path, p, DRIVER_USER)
            assert isinstance(rec, str) and "is not the host npud started" in rec, rec
            no = _grant(rec, p, tid)
            assert not no.ok and "not the host" in no.why
            assert not rt.sched_of(tid).fifo  # type: ignore[union-attr]
        # A record npud wrote for a process that does not run as the driver's user (its
        # uid the record's, the process another's): no tie either.
        assert hr.write(path, stranger.pid, DRIVER_USER) == ""
        rec = hr.adopt(path, stranger.pid, DRIVER_USER)
        assert isinstance(rec, str) and "does not run as the driver's user" in rec, rec
        # No record at all (an npud that predates them, or one that never wrote it).
        hr.remove(path)
        no = _grant(hr.adopt(path, host.pid, DRIVER_USER), host.pid, stranger_tids[0])
        assert not no.ok and "no record" in no.why
    finally:
        for c in (host, other, stranger):
            _stop(c)


def test_an_adopted_hosts_thread_that_spins_is_demoted_by_npuds_watchdog(
        drivers_dir: Path) -> None:
    path = hr.record_path(drivers_dir / "reference.sock")
    child = procs.spawn_as(None, None, sleepy_spinner, timeout=60)
    try:
        _, tid = child.expect(lambda e: e[0] == "tid")
        assert hr.write(path, child.pid, DRIVER_USER) == ""
        rec = hr.adopt(path, child.pid, DRIVER_USER)
        # (the record is written after the stand-in became the driver's user, as the
        # host is by the time a later npud adopts it)
        assert isinstance(rec, hr.HostRecord), rec

        async def npud() -> tuple[int, str]:
            grants = HostRtGrants(MonotonicClock())
            got = grants.grant(hr.grantable(rec, child.pid), tid, 1, 1)
            assert got.ok, got.why
            try:
                while grants.watch.watched():
                    await asyncio.sleep(0.02)
                again = grants.grant(hr.grantable(rec, child.pid), tid, 1, 1)
                return grants.watch.demoted, again.why
            finally:
                grants.stop()

        demoted, again = asyncio.run(npud())
        out = child.wait(30)
    finally:
        child.kill()
    print("CPU at FIFO before npud's watchdog lowered the adopted host's thread:",
          out["fifo_cpu_ms"], "ms")
    assert demoted == 1 and "cooling down" in again
    assert out["policy_after"] == rt.ThreadSched(os.SCHED_OTHER, 0, True)

