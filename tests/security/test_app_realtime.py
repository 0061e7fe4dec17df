"""Real-time threads for apps (service/rt_apps.py, ``set_thread_realtime``) under real
uids: root's npud puts a thread at SCHED_FIFO only for a FOREGROUND caller's own thread, at
most ``app_rt_max_threads`` per uid, and takes it back when it spins, when its uid stops
being FOREGROUND, or when the connection that asked closes. Every refusal is a typed
error and npud keeps serving others."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from npumanager import Importance, NpuManager
from npumanager.errors import LimitExceeded, NpuError, PermissionDenied, RealtimeUnavailable
from npumanager.hal import rt_sched
from npumanager.testing import procs
from tests.security.conftest import StartDaemon
from tests.security.harness import ATTACKER, BYSTANDER, assert_served, needs_root

pytestmark = [needs_root, pytest.mark.fifo]

#: A small CPU bound and fast samples, so a spinner is taken back in a fraction of a second.
RT = {"app_rt_priority": 1, "app_rt_max_threads": 2, "app_rt_max_cpu_ms": 100.0,
      "app_rt_window_s": 1.0, "app_rt_sample_s": 0.05, "app_rt_cooldown_s": 30.0}


def _fifo(tid: int = 0) -> bool:
    s = rt_sched.sched_of(tid)
    return s is not None and s.fifo


def _until(pred: Callable[[], bool], timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def _error(fn: Callable[[], Any]) -> str:
    try:
        fn()
    except NpuError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "granted"


@pytest.fixture
def npud(start_npud: StartDaemon, runtime_dir: Path) -> str:
    start_npud(manager=RT)
    with NpuManager(runtime_dir) as admin:
        admin.set_uid_importance(ATTACKER, Importance.FOREGROUND)
    return str(runtime_dir)


def own_then_close(rt: str) -> tuple[int, bool, bool, bool]:
    """Grant the calling thread; close the connection; is it normal again?"""
    mgr = NpuManager(rt)
    got = mgr.set_thread_realtime()
    during = _fifo()
    s = rt_sched.sched_of(0)
    mgr.close()
    after = _until(lambda: not _fifo(), 2.0)
    return got.priority, during, bool(s and s.reset_on_fork), after


def test_a_foreground_app_gets_its_own_thread_until_its_connection_closes(npud: str) -> None:
    prio, during, reset_on_fork, demoted = procs.run_as(ATTACKER, None, own_then_close, npud)
    assert (prio, during, reset_on_fork, demoted) == (1, True, True, True)


def ask_for(rt: str, tid: int) -> str:
    with NpuManager(rt) as mgr:
        return _error(lambda: mgr.set_thread_realtime(tid))


def park() -> None:
    procs.announce(("tid", threading.get_native_id()))
    procs.receive(timeout=60)


def test_another_uids_thread_and_npuds_own_are_refused(npud: str, start_npud: Any) -> None:
    victim = procs.spawn_as(BYSTANDER, None, park)
    try:
        tid = victim.expect(lambda e: e[0] == "tid")[1]
        got = procs.run_as(ATTACKER, None, ask_for, npud, tid)
        assert got.startswith("PermissionDenied") and "not a thread of" in got, got
        assert not _fifo(tid)
    finally:
        victim.send("done")
        victim.wait(10)
    # npud's own main thread, and this (root's) test thread.
    with NpuManager(npud) as admin:
        npud_pid = int(admin.dump()["daemon"]["pid"])
    for tid in (npud_pid, threading.get_native_id()):
        got = procs.run_as(ATTACKER, None, ask_for, npud, tid)
        assert got.startswith("PermissionDenied"), got
        assert not _fifo(tid)
    assert_served(npud)


def own(rt: str) -> str:
    with NpuManager(rt) as mgr:
        got = _error(mgr.set_thread_realtime)
        return f"{got} fifo={_fifo()}"


def test_a_background_uid_is_refused(npud: str) -> None:
    got = procs.run_as(BYSTANDER, None, own, npud)  # importance unknown: GONE (1000)
    assert got.startswith("PermissionDenied") and "FOREGROUND" in got, got
    assert got.endswith("fifo=False")


def test_app_rt_importance_visible_grants_a_visible_uid_not_a_service_one(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    # voice29: foreground protection sets app_rt_importance = 200 so a voice assistant
    # (VISIBLE) gets its thread; a SERVICE uid still does not, nor a uid npud does not
    # know, and the VISIBLE uid no more threads than app_rt_max_threads; others are served.
    start_npud(manager={**RT, "app_rt_importance": 200})
    with NpuManager(runtime_dir) as admin:
        admin.set_uid_importance(ATTACKER, Importance.VISIBLE)
        admin.set_uid_importance(BYSTANDER, Importance.SERVICE)
    rt = str(runtime_dir)
    assert procs.run_as(ATTACKER, None, own_then_close, rt) == (1, True, True, True)
    got = procs.run_as(BYSTANDER, None, own, rt)
    assert got.startswith("PermissionDenied") and "VISIBLE (200)" in got, got
    assert got.endswith("fifo=False")
    out = procs.run_as(ATTACKER, None, three_threads, rt)
    assert out == ["granted", "granted", "LimitExceeded", "granted", "[True, True, False]"], out
    assert_served(runtime_dir)


def three_threads(rt: str) -> list[str]:
    """Ask for three threads of this process on one connection (the bound is 2)."""
    out: list[str] = []
    stop = threading.Event()
    tids: list[int] = []

    def sit() -> None:
        tids.append(threading.get_native_id())
        stop.wait(30)

    threads = [threading.Thread(target=sit) for _ in range(3)]
    for t in threads:
        t.start()
    _until(lambda: len(tids) == 3, 5)
    with NpuManager(rt) as mgr:
        for tid in tids:
            out.append(_error(lambda t=tid: mgr.set_thread_realtime(t)).split(":")[0])  # type: ignore[misc]
        out.append(_error(lambda: mgr.set_thread_realtime(tids[0])))  # again: counted once
        out.append(str([_fifo(t) for t in tids]))
        # Many more requests: each refused, npud keeps serving.
        for _ in range(200):
            try:
                mgr.set_thread_realtime(tids[2])
            except LimitExceeded:
                pass
    stop.set()
    for t in threads:
        t.join(10)
    return out


def test_at_most_two_threads_per_uid(npud: str) -> None:
    got = procs.run_as(ATTACKER, None, three_threads, npud)
    assert got == ["granted", "granted", "LimitExceeded", "granted",
                   "[True, True, False]"], got
    assert_served(npud)


def spin(rt: str) -> dict[str, Any]:
    """Get a grant, then spin (bounded: 3 s) until npud takes it back: 2 ms of CPU at a
    time with a 0.1 ms sleep between, each of which restarts RLIMIT_RTTIME's count (so
    the app's own SIGXCPU backstop, hal/rt_backstop.py, never fires: npud's watchdog is
    what bounds a thread that blocks now and then)."""
    with NpuManager(rt) as mgr:
        mgr.set_thread_realtime()
        start_cpu = rt_sched.cpu_ns(0) or 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3.0 and _fifo():
            start = rt_sched.cpu_ns(0) or 0
            while (rt_sched.cpu_ns(0) or 0) - start < 2_000_000:
                pass
            time.sleep(0.0001)
        out = {"demoted": not _fifo(), "wall_s": time.monotonic() - t0,
               "cpu_ms": ((rt_sched.cpu_ns(0) or 0) - start_cpu) / 1e6}
        out["again"] = _error(mgr.set_thread_realtime).split(":")[0]
        return out


def test_a_spinning_thread_is_demoted_within_its_cpu_bound(npud: str) -> None:
    got = procs.run_as(ATTACKER, None, spin, npud)
    assert got["demoted"], got
    # Bound: 100 ms in the window, sampled every 50 ms; slack for npud's own wake-up on a
    # busy 2-CPU machine.
    assert got["cpu_ms"] < 100 + 50 + 250, got
    assert got["again"] == "LimitExceeded", got  # the uid's cooldown
    assert_served(npud)


def wait_for_demotion(rt: str) -> bool:
    with NpuManager(rt) as mgr:
        mgr.set_thread_realtime()
        procs.announce("granted")
        return _until(lambda: not _fifo(), 10.0)


def test_a_uid_that_stops_being_foreground_loses_its_thread(npud: str) -> None:
    child = procs.spawn_as(ATTACKER, None, wait_for_demotion, npud)
    child.expect("granted")
    with NpuManager(npud) as admin:
        admin.set_uid_importance(ATTACKER, Importance.CACHED)
    assert child.wait(15) is True


def test_off_without_app_rt_priority(start_npud: StartDaemon, runtime_dir: Path) -> None:
    """No app_rt_priority and protection off (DaemonProcess passes --protect-foreground
    off; with "auto" as root npud would imply app_rt_priority = 2): a FOREGROUND uid's
    request is refused."""
    start_npud()
    with NpuManager(runtime_dir) as admin:
        admin.set_uid_importance(ATTACKER, Importance.FOREGROUND)
    got = procs.run_as(ATTACKER, None, own, str(runtime_dir))
    assert got.startswith(RealtimeUnavailable.__name__), got
    assert got.endswith("fifo=False")
    assert PermissionDenied  # (the refusals above are typed: see the other tests)
    assert os.getuid() == 0


def burst_realtime(rt: str) -> dict[str, Any]:
    """The SDK: a burst with realtime=True, its executing thread, then closed."""
    from npumanager.testing.onnx_models import add_model
    from tests.security.driver_apps import X, granted

    with granted(rt) as (dev, grant):
        model = dev.prepare_model(add_model(4, 1.0), grant=grant)
        b = model.burst(realtime=True)
        y = b.execute({"x": X})["y"].ravel().tolist()
        b.execute({"x": X})
        out = {"y": y, "granted": b.realtime_granted, "fifo": _fifo(),
               "error": type(b._realtime.error).__name__ if b._realtime and b._realtime.error
               else None}
        b.close()
        out["after_close"] = _until(lambda: not _fifo(), 2.0)
        model.release()
        return out


def test_a_burst_asks_for_its_executing_thread_and_goes_on_without_when_refused(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(manager=RT, drivers=True)
    rt = str(runtime_dir)
    with NpuManager(rt) as admin:
        admin.set_uid_importance(ATTACKER, Importance.FOREGROUND)
    got = procs.run_as(ATTACKER, None, burst_realtime, rt, timeout=60)
    assert got == {"y": [1.0, 2.0, 3.0, 4.0], "granted": True, "fifo": True, "error": None,
                   "after_close": True}, got
    got = procs.run_as(BYSTANDER, None, burst_realtime, rt, timeout=60)  # not FOREGROUND
    assert got == {"y": [1.0, 2.0, 3.0, 4.0], "granted": False, "fifo": False,
                   "error": "PermissionDenied", "after_close": True}, got
