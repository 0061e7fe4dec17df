"""npud's raise of a driver host's starved compile (service/host_raise.py), with the test
process standing in for the host and a child of it for its compile child: the decision's
checks, its rate bound and npud's own lowering one bound later on a virtual clock; the
policies read back from the kernel. Under real uids: tests/security/test_host_raise.py."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator

import pytest

from npumanager.errors import InvalidArgument, LimitExceeded, PermissionDenied
from npumanager.hal import proc_tree, raise_wire
from npumanager.service.host_raise import RATE_BOUNDS, HostRaises, bound_of
from npumanager.testing.clock import VirtualClock

BOUND = 0.2
IDLE, OTHER = os.SCHED_IDLE, os.SCHED_OTHER

needs_nice = pytest.mark.skipif(os.geteuid() != 0, reason="raising from SCHED_IDLE needs "
                                "CAP_SYS_NICE (npud runs as root)")


def policies(pid: int) -> set[tuple[int, int]]:
    """(policy, nice) of every thread of ``pid``."""
    return {(os.sched_getscheduler(t) & ~os.SCHED_RESET_ON_FORK,
             os.getpriority(os.PRIO_PROCESS, t)) for t in proc_tree.threads_of(pid)}


@pytest.fixture
def idle_child() -> Iterator[subprocess.Popen[bytes]]:
    """A child of this process (the stand-in host) at SCHED_IDLE nice 5, sleeping."""
    p = subprocess.Popen(["sleep", "60"])
    os.sched_setscheduler(p.pid, IDLE, os.sched_param(0))
    os.setpriority(os.PRIO_PROCESS, p.pid, 5)
    try:
        yield p
    finally:
        p.kill()
        p.wait()


def test_the_wire_round_trips_and_refuses_a_wrong_length() -> None:
    assert raise_wire.decode_request(raise_wire.encode_request(123, 0)) == (123, 0)
    got = raise_wire.decode_applied(raise_wire.encode_applied(5, 6, False, "x" * 500))
    assert got[:3] == (5, 6, False) and len(got[3]) == 200
    for bad in (b"", b"1234567", b"123456789"):
        with pytest.raises(InvalidArgument):
            raise_wire.decode_request(bad)
    with pytest.raises(InvalidArgument):
        raise_wire.decode_applied(b"123")


def test_the_bound_of_a_driver_entry() -> None:
    assert bound_of({}) == 0.2
    assert bound_of({"background_starve_ms": 50}) == 0.05
    assert bound_of({"background_sched": "share", "background_starve_ms": 50}) == 0.05
    assert bound_of({"background_sched": "nice"}) == 0.0
    assert bound_of({"background_sched": "normal"}) == 0.0
    assert bound_of({"background_starve_ms": 0}) == 0.0
    assert bound_of({"background_starve_ms": "x"}) == 0.0


@needs_nice
def test_a_raise_lasts_one_bound_and_the_next_waits_for_the_rate_bound(
        idle_child: subprocess.Popen[bytes]) -> None:
    clock = VirtualClock()
    raises = HostRaises(clock)
    host, pid = os.getpid(), idle_child.pid
    assert raises.raise_tree(host, pid, 0, BOUND) == 1
    assert policies(pid) == {(OTHER, 0)}  # nice 0, not the 5 it had, never below
    with pytest.raises(LimitExceeded):
        raises.raise_tree(host, pid, 0, BOUND)
    clock.advance(BOUND)  # npud lowers it itself after one bound
    assert policies(pid) == {(IDLE, 0)} and raises.lowered == 1 and raises.pending() == 0
    clock.advance(RATE_BOUNDS * BOUND - BOUND - 0.01)
    with pytest.raises(LimitExceeded):
        raises.raise_tree(host, pid, 0, BOUND)
    clock.advance(0.01)
    assert raises.raise_tree(host, pid, 0, BOUND) == 1
    assert (raises.raised, raises.refused) == (2, 2)


@needs_nice
def test_what_the_host_lowered_already_npud_leaves_alone(
        idle_child: subprocess.Popen[bytes]) -> None:
    clock = VirtualClock()
    raises = HostRaises(clock)
    raises.raise_tree(os.getpid(), idle_child.pid, 0, BOUND)
    os.sched_setscheduler(idle_child.pid, IDLE, os.sched_param(0))  # the host lowers it
    os.setpriority(os.PRIO_PROCESS, idle_child.pid, 7)
    clock.advance(BOUND)
    assert raises.lowered == 0 and policies(idle_child.pid) == {(IDLE, 7)}


@needs_nice
def test_refusals_are_typed_and_change_nothing(idle_child: subprocess.Popen[bytes]) -> None:
    raises = HostRaises(VirtualClock())
    host, pid = os.getpid(), idle_child.pid
    before = policies(pid)
    with pytest.raises(PermissionDenied, match="off for this driver"):
        raises.raise_tree(host, pid, 0, 0.0)
    with pytest.raises(PermissionDenied, match="not a host this npud started"):
        raises.raise_tree(None, pid, 0, BOUND)
    with pytest.raises(PermissionDenied, match="its host exited"):  # (the supervisor's why)
        raises.raise_tree("its host exited", pid, 0, BOUND)
    with pytest.raises(InvalidArgument, match="whole driver host"):
        raises.raise_tree(host, host, 0, BOUND)
    with pytest.raises(InvalidArgument):
        raises.raise_tree(host, -1, 0, BOUND)
    with pytest.raises(PermissionDenied, match="not driver host"):
        raises.raise_tree(host, 1, 0, BOUND)  # pid 1: no descendant of the host
    with pytest.raises(PermissionDenied, match="not a thread of process"):
        raises.raise_tree(host, pid, host, BOUND)  # the host's thread id under the child
    assert policies(pid) == before and raises.raised == 0 and raises.refused == 7


@needs_nice
def test_a_host_thread_is_raised_with_the_processes_it_forked_and_nothing_else(
        ) -> None:
    """The tree of a host thread: that thread and its children, not the host's others."""
    raises = HostRaises(VirtualClock())
    ready, done = threading.Event(), threading.Event()
    seen: dict[str, int] = {}

    def compiling() -> None:
        os.sched_setscheduler(0, IDLE, os.sched_param(0))
        child = subprocess.Popen(["sleep", "60"])  # (inherits SCHED_IDLE)
        seen["tid"], seen["child"] = threading.get_native_id(), child.pid
        ready.set()
        done.wait(30)
        child.kill()
        child.wait()

    other = threading.Thread(target=lambda: (os.sched_setscheduler(0, IDLE, os.sched_param(0)),
                                             done.wait(30)))
    t = threading.Thread(target=compiling)
    other.start()
    t.start()
    try:
        assert ready.wait(10)
        tree = proc_tree.tree(os.getpid(), seen["tid"])
        assert (os.getpid(), seen["tid"]) in tree
        assert (seen["child"], seen["child"]) in tree and len(tree) == 2, tree
        assert raises.raise_tree(os.getpid(), os.getpid(), seen["tid"], BOUND) == 2
        assert os.sched_getscheduler(seen["tid"]) == OTHER
        assert policies(seen["child"]) == {(OTHER, 0)}
        assert os.sched_getscheduler(other.native_id or 0) == IDLE  # not in the tree
    finally:
        done.set()
        t.join(10)
        other.join(10)
