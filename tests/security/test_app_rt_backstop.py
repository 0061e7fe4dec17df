"""A real-time app thread stays bounded when npud is gone (hal/rt_backstop.py, and npud's
RLIMIT_RTTIME check in service/rt_apps.py), under real uids: an app's thread granted
SCHED_FIFO by root's npud, npud SIGKILLed (no watchdog left), the thread spinning: the
app's own SIGXCPU handler lowers it after RLIMIT_RTTIME's soft limit of CPU (50 ms),
before the hard limit (500 ms) at which the kernel would kill the app. And npud grants
nothing to a process that has not bounded itself (hard limit unlimited, or above
500 ms), whatever client it uses."""

from __future__ import annotations

import contextlib
import os
import resource
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from npumanager import Importance, NpuManager
from npumanager.errors import NpuError
from npumanager.hal import rt_backstop, rt_sched
from npumanager.paths import manager_socket
from npumanager.proto.v1.manager_pb2 import ThreadRealtime
from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model
from npumanager.wire.client import SyncRpcClient
from tests.hal.test_rt_sched import needs_fifo
from tests.security.conftest import StartDaemon
from tests.security.harness import ATTACKER, assert_served, needs_root

pytestmark = [needs_root, needs_fifo, pytest.mark.fifo]

#: npud's own watchdog well above what the test measures (so what lowers the thread is
#: the app's backstop, not npud before it died).
RT = {"app_rt_priority": 1, "app_rt_max_cpu_ms": 400.0, "app_rt_sample_s": 0.05}


def _fifo(tid: int = 0) -> bool:
    s = rt_sched.sched_of(tid)
    return s is not None and s.fifo


def _until(pred: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end and not pred():
        time.sleep(0.005)
    return bool(pred())


def granted_then_spin(rt: str) -> dict[str, Any]:
    """The app's main thread granted FIFO with the client's backstop but on a connection
    nothing watches (the clients lower their threads when their connection ends: a raw,
    unthreaded one here, as a client that does not); once told npud is dead, it spins
    (2 s of CPU at most) until it is no longer at FIFO."""
    tid = threading.get_native_id()
    rt_backstop.prepare(tid)
    rpc = SyncRpcClient(str(manager_socket(rt)), "manager", threaded=False)
    rpc.call("set_thread_realtime", ThreadRealtime(tid=tid))
    procs.announce(("granted", tid, resource.getrlimit(resource.RLIMIT_RTTIME)))
    assert procs.receive(timeout=60) == "spin"
    out: dict[str, Any] = {"fifo_before": _fifo()}
    t0 = rt_sched.cpu_ns(0) or 0
    while _fifo():
        if (rt_sched.cpu_ns(0) or 0) - t0 > 2_000_000_000:
            break
    out["fifo_cpu_ms"] = ((rt_sched.cpu_ns(0) or 0) - t0) / 1e6
    out["after"] = rt_sched.sched_of(0)
    out["counts"] = dict(rt_backstop.counts)
    rpc.close()
    return out


def test_npud_killed_a_spinning_app_thread_is_lowered_by_its_own_backstop(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud(manager=RT)
    with NpuManager(runtime_dir) as admin:
        admin.set_uid_importance(ATTACKER, Importance.FOREGROUND)
    child = procs.spawn_as(ATTACKER, None, granted_then_spin, str(runtime_dir), timeout=60)
    try:
        _, tid, limits = child.expect(lambda e: e[0] == "granted", 30)
        assert limits == (rt_backstop.RTTIME_SOFT_US, rt_sched.RTTIME_HARD_US)
        assert rt_sched.sched_of(tid) == rt_sched.ThreadSched(os.SCHED_FIFO, 1, True)
        npud.proc.kill()  # type: ignore[union-attr]  # SIGKILL: no stop, no demotion
        npud.proc.wait(10)  # type: ignore[union-attr]
        time.sleep(0.2)
        assert _fifo(tid), "npud's death lowered the thread (then nothing is tested here)"
        child.send("spin")
        got = child.wait(30)
    finally:
        child.kill()
    print("CPU at FIFO, npud dead, before the app's SIGXCPU handler lowered it:",
          got["fifo_cpu_ms"], "ms")
    assert got["fifo_before"] and got["counts"]["signals"] == 1, got
    assert got["after"] == rt_sched.ThreadSched(os.SCHED_OTHER, 0, True), got
    # The soft limit's CPU at FIFO; well before the hard one (which would kill the app).
    assert (rt_backstop.RTTIME_SOFT_US / 1000 * 0.9 <= got["fifo_cpu_ms"]
            < rt_sched.RTTIME_HARD_US / 1000), got


def raw_ask(rt: str, hard_us: int | None) -> str:
    """A client that skips the backstop (speaks the wire itself), its RLIMIT_RTTIME hard
    limit ``hard_us`` (None: unlimited, the default)."""
    if hard_us is not None:
        resource.setrlimit(resource.RLIMIT_RTTIME, (hard_us, hard_us))
    rpc = SyncRpcClient(rt, "manager", threaded=False)
    try:
        rpc.call("set_thread_realtime", ThreadRealtime(tid=threading.get_native_id()))
        out = "granted"
    except NpuError as exc:
        out = f"{type(exc).__name__}: {exc}"
    try:
        return f"{out} | fifo={_fifo()}"
    finally:
        rpc.close()


@pytest.mark.parametrize("hard_us", [None, rt_sched.RTTIME_HARD_US + 1])
def test_a_process_without_the_rttime_bound_is_refused(
        start_npud: StartDaemon, runtime_dir: Path, hard_us: int | None) -> None:
    start_npud(manager=RT)
    with NpuManager(runtime_dir) as admin:
        admin.set_uid_importance(ATTACKER, Importance.FOREGROUND)
    sock = str(manager_socket(runtime_dir))
    got = procs.run_as(ATTACKER, None, raw_ask, sock, hard_us)
    now = "unlimited" if hard_us is None else f"{hard_us} µs"
    assert got.startswith("PermissionDenied") and f"hard limit is {now}" in got, got
    assert "setrlimit" in got and got.endswith("fifo=False"), got
    # At the bound: granted (what the client sets).
    got = procs.run_as(ATTACKER, None, raw_ask, sock, rt_sched.RTTIME_HARD_US)
    assert got == "granted | fifo=True", got
    assert_served(str(runtime_dir))


def granted_then_wait(rt: str, burst: bool) -> dict[str, Any]:
    """The app's main thread granted FIFO through NpuManager (or the SDK's
    ``burst(realtime=True)``), then idle until told npud is dead: is it lowered?"""
    from tests.security.driver_apps import X, granted

    with contextlib.ExitStack() as stack:
        if burst:
            dev, grant = stack.enter_context(granted(rt))
            model = dev.prepare_model(add_model(4, 1.0), grant=grant)
            b = model.burst(realtime=True)
            b.execute({"x": X})
            ok = b.realtime_granted
        else:
            mgr = stack.enter_context(NpuManager(rt, reconnect=False))
            ok = mgr.set_thread_realtime().priority == 1
        procs.announce(("granted", ok, _fifo()))
        assert procs.receive(timeout=60) == "npud-dead"
        t0 = time.monotonic()
        lowered = _until(lambda: not _fifo(), 5.0)
        out = {"lowered": lowered, "after_s": time.monotonic() - t0,
               "counts": dict(rt_backstop.counts), "policy": rt_sched.sched_of(0)}
        if burst:
            b.close()
        return out


@pytest.mark.parametrize("burst", [False, True], ids=["NpuManager", "burst"])
def test_npud_killed_the_client_lowers_its_granted_thread_at_once(
        start_npud: StartDaemon, runtime_dir: Path, burst: bool) -> None:
    """The connection that asked ends with npud: the client lowers the thread itself, as
    npud does at a connection's close, before it has spun at all."""
    npud = start_npud(manager=RT, drivers=burst)
    with NpuManager(runtime_dir) as admin:
        admin.set_uid_importance(ATTACKER, Importance.FOREGROUND)
    child = procs.spawn_as(ATTACKER, None, granted_then_wait, str(runtime_dir), burst,
                           timeout=90)
    try:
        assert child.expect(lambda e: e[0] == "granted", 60) == ("granted", True, True)
        npud.proc.kill()  # type: ignore[union-attr]
        npud.proc.wait(10)  # type: ignore[union-attr]
        child.send("npud-dead")
        got = child.wait(30)
    finally:
        child.kill()
    print(f"npud killed; the {'burst' if burst else 'NpuManager'} thread normal",
          round(got["after_s"] * 1000, 1), "ms after the app was told (0: already)")
    assert got["lowered"] and got["counts"]["lowered_gone"] == 1, got
    assert got["counts"]["signals"] == 0, got  # (not the soft limit: it never spun)
    assert got["policy"] == rt_sched.ThreadSched(os.SCHED_OTHER, 0, True), got
