"""npud's raise of a driver host's starved compile (service/host_raise.py) against a hostile
host, under real uids: a stand-in host runs as the driver's user (as the real host does
once it gave up root; RLIMIT_NICE 0, so it cannot leave SCHED_IDLE itself) with a compile
child and a compiling thread at SCHED_IDLE, and the test plays npud (root) with npud's own
code. Only the host's compiling thread and the processes descending from it, of its uid,
are raised, to nice 0 and no further; npud's own process, pid 1, another uid's process and
a process of the driver user that the host did not start are refused with a typed error
and left as they were; a flood of requests gets one raise per rate bound."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from npumanager.errors import InvalidArgument, LimitExceeded, PermissionDenied
from npumanager.hal import proc_tree
from npumanager.service.host_compile_watch import HostCompileWatch
from npumanager.service.host_raise import RATE_BOUNDS, HostRaises
from npumanager.testing import procs
from npumanager.testing.clock import VirtualClock
from tests.security.harness import ATTACKER, needs_root
from tests.security.test_driver_user import expected_user

pytestmark = needs_root
DRIVER_USER = expected_user().pw_uid
BOUND = 0.2
IDLE, OTHER = os.SCHED_IDLE, os.SCHED_OTHER


def policies(pid: int) -> set[tuple[int, int]]:
    """(policy, nice) of every thread of ``pid``."""
    return {(os.sched_getscheduler(t) & ~os.SCHED_RESET_ON_FORK,
             os.getpriority(os.PRIO_PROCESS, t)) for t in proc_tree.threads_of(pid)}


def idle_process(become: int | None) -> None:
    """A process at SCHED_IDLE (as ``become``, when given), parked until told."""
    if become is not None:
        os.setgroups([])
        os.setgid(expected_user().pw_gid)
        os.setuid(become)
    os.sched_setscheduler(0, IDLE, os.sched_param(0))
    procs.announce("idle")
    procs.receive(120)


def stand_in_host() -> None:
    """A host as npud starts one, then its driver user without RLIMIT_NICE: a compile
    child and a compiling thread (with a child of its own) at SCHED_IDLE, announced; it
    checks it may not raise them itself; parked until told."""
    import resource

    resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
    os.setgroups([])
    os.setgid(expected_user().pw_gid)
    os.setuid(DRIVER_USER)
    child = subprocess.Popen(["sleep", "120"])
    os.sched_setscheduler(child.pid, IDLE, os.sched_param(0))
    ready, stop = threading.Event(), threading.Event()
    got: dict[str, Any] = {}

    def compiling() -> None:
        os.sched_setscheduler(0, IDLE, os.sched_param(0))
        gxx = subprocess.Popen(["sleep", "120"])  # (inherits SCHED_IDLE)
        got.update(tid=threading.get_native_id(), gxx=gxx.pid)
        ready.set()
        stop.wait(120)
        gxx.kill()
        gxx.wait()

    t = threading.Thread(target=compiling)
    t.start()
    ready.wait(30)
    try:
        os.sched_setscheduler(child.pid, OTHER, os.sched_param(0))
        itself = "allowed"
    except PermissionError:
        itself = "refused"
    procs.announce(("host", child.pid, got["tid"], got["gxx"], itself))
    procs.receive(120)
    stop.set()
    t.join(30)
    child.kill()
    child.wait()


def try_below_0(pid: int) -> str:
    try:
        os.setpriority(os.PRIO_PROCESS, pid, -1)
    except PermissionError:
        return "refused"
    return "allowed"


@pytest.fixture
def host() -> Iterator[tuple[procs.Child, int, int, int]]:
    h = procs.spawn_as(None, None, stand_in_host, timeout=200)
    try:
        _, child, tid, gxx, itself = h.expect(lambda e: e[0] == "host")
        assert itself == "refused"  # the host cannot raise its compile child itself
        yield h, child, tid, gxx
        h.send("stop")
        h.wait(30)
    finally:
        h.kill()


@pytest.fixture
def bystanders() -> Iterator[dict[str, int]]:
    """Processes at SCHED_IDLE the host has no claim on: another uid's, and one of the
    driver user's own that the host did not start."""
    kids = {"other uid": procs.spawn_as(None, None, idle_process, ATTACKER, timeout=200),
            "same uid": procs.spawn_as(None, None, idle_process, DRIVER_USER, timeout=200)}
    try:
        for k in kids.values():
            k.expect("idle")
        yield {name: k.pid for name, k in kids.items()}
        for k in kids.values():
            k.send("stop")
            k.wait(30)
    finally:
        for k in kids.values():
            k.kill()


def test_the_hosts_compile_child_and_compiling_thread_are_raised_to_nice_0_only(
        host: tuple[procs.Child, int, int, int]) -> None:
    h, child, tid, gxx = host
    clock = VirtualClock()
    raises = HostRaises(clock)
    assert raises.raise_tree(h.pid, child, 0, BOUND) == 1
    assert policies(child) == {(OTHER, 0)}
    assert proc_tree.proc_info(child) == proc_tree.ProcInfo(h.pid, DRIVER_USER)
    # nice 0 is as far as it goes: the driver user cannot go below it.
    assert procs.run_as(DRIVER_USER, None, try_below_0, child) == "refused"
    assert policies(child) == {(OTHER, 0)}
    clock.advance(BOUND)  # lowered again by npud after one bound
    assert policies(child) == {(IDLE, 0)}
    clock.advance(RATE_BOUNDS * BOUND)
    # The compiling thread and its g++, not the host's other threads.
    assert raises.raise_tree(h.pid, h.pid, tid, BOUND) == 2
    assert os.sched_getscheduler(tid) == OTHER and policies(gxx) == {(OTHER, 0)}
    others = set(proc_tree.threads_of(h.pid)) - {tid}
    assert all(os.sched_getscheduler(t) != IDLE or t == tid for t in others)
    clock.advance(BOUND)
    assert os.sched_getscheduler(tid) == IDLE and policies(gxx) == {(IDLE, 0)}


def test_a_host_cannot_have_npud_raise_what_is_not_its_own(
        host: tuple[procs.Child, int, int, int], bystanders: dict[str, int]) -> None:
    h, child, _tid, _gxx = host
    raises = HostRaises(VirtualClock())
    # npud's own process, with a thread at SCHED_IDLE to make a raise visible.
    parked, stop = threading.Event(), threading.Event()

    def npud_idle_thread() -> None:
        os.sched_setscheduler(0, IDLE, os.sched_param(0))
        parked.set()
        stop.wait(60)

    t = threading.Thread(target=npud_idle_thread)
    t.start()
    parked.wait(10)
    try:
        targets = {"npud": (os.getpid(), 0), "npud's thread": (os.getpid(), t.native_id or 0),
                   "pid 1": (1, 0), **{k: (p, 0) for k, p in bystanders.items()},
                   # a thread of another process named under the host's child
                   "a stranger's thread": (child, bystanders["same uid"])}
        before = {k: policies(p) for k, (p, _) in targets.items()}
        for name, (pid, tid) in targets.items():
            with pytest.raises(PermissionDenied):
                raises.raise_tree(h.pid, pid, tid, BOUND)
            assert policies(pid) == before[name], name
        assert os.sched_getscheduler(t.native_id or 0) == IDLE
        with pytest.raises(InvalidArgument, match="whole driver host"):
            raises.raise_tree(h.pid, h.pid, 0, BOUND)
        assert raises.raised == 0 and raises.refused == len(targets) + 1
    finally:
        stop.set()
        t.join(10)


def test_a_flood_of_requests_gets_one_raise_per_rate_bound(
        host: tuple[procs.Child, int, int, int]) -> None:
    h, child, tid, _gxx = host
    clock = VirtualClock()
    raises = HostRaises(clock)
    got: list[str] = []
    for i in range(3000):  # 1000 requests in each of three windows of 1.5 bounds
        if i and i % 1000 == 0:
            clock.advance(RATE_BOUNDS * BOUND)
        target = (child, 0) if i % 2 else (h.pid, tid)
        try:
            raises.raise_tree(h.pid, *target, BOUND)
            got.append("raised")
        except LimitExceeded:
            got.append("limited")
    assert got.count("raised") == 3 and raises.raised == 3, got.count("raised")
    assert got.count("limited") == 2997


def test_a_host_cannot_have_npud_watch_what_is_not_its_own(
        host: tuple[procs.Child, int, int, int], bystanders: dict[str, int]) -> None:
    """npud's watch of in-host compiles (service/host_compile_watch.py) checks as a raise
    does: only the host's thread or its descendants; the rest refused, typed, unwatched."""
    h, child, tid, _gxx = host
    watch = HostCompileWatch(VirtualClock(), HostRaises(VirtualClock()))
    for pid, t in [(os.getpid(), 0), (1, 0), (bystanders["other uid"], 0),
                   (bystanders["same uid"], 0), (child, -bystanders["same uid"])]:
        with pytest.raises(PermissionDenied):
            watch.watch(h.pid, pid, t, True, BOUND)
    with pytest.raises(InvalidArgument):
        watch.watch(h.pid, h.pid, 0, True, BOUND)
    assert watch.watched() == 0
    watch.watch(h.pid, h.pid, -tid, True, BOUND)  # its compiling thread: watched
    watch.watch(h.pid, child, 0, True, BOUND)
    assert watch.watched() == 2
