"""npud's watch of a compile that runs in a driver host itself (service/
host_compile_watch.py). The host here is a child process whose lowered thread does pure
Python work, holding the child's GIL while it waits for the CPU: the case a watch inside
the host cannot serve (its own thread waits for that GIL too). The compiling thread and
two normal-priority busy loops share one CPU, so the work gets that CPU only when raised
(at SCHED_IDLE ~0.15 % of it); this process plays npud and raises it from outside. The
loops run only inside the test and are killed in it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from npumanager.clock import MonotonicClock
from npumanager.errors import InvalidArgument, LimitExceeded, PermissionDenied
from npumanager.service.host_compile_watch import MAX_WATCHED, HostCompileWatch
from npumanager.service.host_raise import HostRaises
from npumanager.testing.clock import VirtualClock
from npumanager.testing.spinners import spin_every_cpu
from npumanager.testing.spinners import stop as stop_spinning

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="npud's raise needs CAP_SYS_NICE")

#: A stand-in host: a lowered thread pinned to CPU argv[1] doing ~0.3 s of Python work
#: (the GIL held throughout), its tid on stdout first, "done" after.
_HOST = """
import os, sys, threading
cpu = int(sys.argv[1])
def work():
    os.sched_setaffinity(0, {cpu})
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    print(threading.get_native_id(), flush=True)
    x = 0
    for i in range(6_000_000):
        x += i
    print("done", flush=True)
t = threading.Thread(target=work)
t.start()
t.join()
"""


def test_a_watch_is_refused_what_a_raise_would_be() -> None:
    watch = HostCompileWatch(VirtualClock(), HostRaises(VirtualClock()))
    me = os.getpid()
    with pytest.raises(PermissionDenied, match="off for this driver"):
        watch.watch(me, me, threading.get_native_id(), True, 0.0)
    with pytest.raises(PermissionDenied, match="not a host this npud started"):
        watch.watch(None, me, threading.get_native_id(), True, 0.1)
    with pytest.raises(PermissionDenied, match="not driver host"):
        watch.watch(me, 1, 0, True, 0.1)  # pid 1
    with pytest.raises(InvalidArgument, match="whole driver host"):
        watch.watch(me, me, 0, True, 0.1)
    assert watch.watched() == 0 and watch.refused == 4


def test_at_most_max_watched_per_host_and_an_ended_watch_frees_its_place() -> None:
    watch = HostCompileWatch(VirtualClock(), HostRaises(VirtualClock()))
    me = os.getpid()
    kids = [subprocess.Popen(["sleep", "30"]) for _ in range(MAX_WATCHED + 1)]
    try:
        for k in kids[:MAX_WATCHED]:
            watch.watch(me, k.pid, 0, True, 0.1)
        with pytest.raises(LimitExceeded):
            watch.watch(me, kids[-1].pid, 0, True, 0.1)
        watch.watch(me, kids[0].pid, 0, False, 0.1)
        watch.watch(me, kids[-1].pid, 0, True, 0.1)
        assert watch.watched() == MAX_WATCHED
    finally:
        for k in kids:
            k.kill()
            k.wait()
    watch.tick()  # the trees gone: dropped
    assert watch.watched() == 0


@pytest.mark.timeout(120)
def test_a_host_thread_holding_its_gil_while_starved_is_raised_by_npud_and_completes(
        ) -> None:
    cpu = max(os.sched_getaffinity(0))
    bound_s = 0.1
    raises = HostRaises(MonotonicClock())
    watch = HostCompileWatch(MonotonicClock(), raises)
    loops: list[Any] = []

    def spin_on_cpu() -> None:  # (affinity is per thread: the loops inherit this one's)
        os.sched_setaffinity(0, {cpu})
        loops.extend(spin_every_cpu(2))

    host = None
    try:
        s = threading.Thread(target=spin_on_cpu)
        s.start()
        s.join(60)
        assert len(loops) == 2
        host = subprocess.Popen([sys.executable, "-c", _HOST, str(cpu)],
                                stdout=subprocess.PIPE, text=True)
        assert host.stdout is not None
        tid = int(host.stdout.readline())
        watch.watch(host.pid, host.pid, -tid, True, bound_s)
        t0 = time.monotonic()
        done = threading.Event()
        out: list[str] = []
        reader = threading.Thread(target=lambda: (out.append(host.stdout.readline()),  # type: ignore[union-attr]
                                                  done.set()))
        reader.start()
        while not done.wait(bound_s / 2) and time.monotonic() - t0 < 90:
            watch.tick()  # (npud's task does this on its loop)
        took = time.monotonic() - t0
        watch.watch(host.pid, host.pid, -tid, False, bound_s)
    finally:
        stop_spinning(loops)
        if host is not None:
            host.kill()
            host.wait()
            if host.stdout is not None:
                host.stdout.close()
    assert out == ["done\n"], (out, took)
    assert raises.raised >= 1 and watch.watched() == 0, (raises.raised, took)
