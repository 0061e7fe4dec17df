"""Where a contention run's device and CPU went, per app (npumanager/demo/contention_probe.py):
the sums are exact on made-up records; the thread grouping and the role map on real /proc."""

from __future__ import annotations

import os
import threading
import time

import pytest

from npumanager.demo.contention import RunResult
from npumanager.demo.contention_cpu import CpuMark
from npumanager.demo.contention_probe import (
    DeviceUse,
    cpu_by_role,
    device_use,
    roles_of,
    rows,
    thread_jiffies,
)


def test_device_use_sums_each_apps_steps_in_the_window() -> None:
    steps = [{"uid": 62003, "start": 10.0, "dur": 0.005},  # before the window
             {"uid": 62003, "start": 11.0, "dur": 0.005},
             {"uid": 62003, "start": 11.5, "dur": 0.004},
             {"uid": 62004, "start": 12.0, "dur": 0.001},
             {"uid": 99, "start": 12.5, "dur": 0.002},
             {"uid": 62004, "start": 13.0, "dur": 0.001}]  # at the window's end: out
    stats = {"uids": {"62003": {"p50_ms": 80.0}, "62004": {"p50_ms": 2.5}, "7": {}}}
    use = device_use(steps, 11.0, 13.0, {62003: "llm", 62004: "embedder"}, stats)
    assert set(use) == {"llm", "embedder", "99"}
    assert (use["llm"].steps, use["llm"].busy_s) == (2, pytest.approx(0.009))
    assert use["llm"].latency_p50_ms == 80.0 and use["embedder"].latency_p50_ms == 2.5
    assert use["embedder"].cell() == "0.00 dev / 0 steps/s / 1.00 ms (p90 1.00), lat 2.50"
    assert use["llm"].cell().startswith("0.00 dev / 1 steps/s / 4.50 ms (p90 5.00)")
    assert DeviceUse().cell() == "-"


def test_cpu_by_role_adds_up_each_roles_processes() -> None:
    a = CpuMark(busy=0, steal=0, ours={1: 100, 2: 50, 3: 0, 4: 7}, tick=0.01)
    b = CpuMark(busy=0, steal=0, ours={1: 300, 2: 150, 3: 40, 4: 9, 5: 20}, tick=0.01)
    roles = roles_of({"llm": 2}, npud=3, hosts=[4], pids=[2, 3, 4, 5])
    assert roles == {2: "llm", 3: "npud", 4: "driver", 5: "other"}
    # pid 1 (the bench itself) has no role; pid 5 started within: counted from zero.
    assert cpu_by_role(a, b, roles, 2.0) == {"driver": 0.01, "llm": 0.5, "npud": 0.2,
                                             "other": 0.1}


def test_threads_are_grouped_by_kernel_name_without_their_number() -> None:
    import ctypes

    libc = ctypes.CDLL(None)
    stop = threading.Event()

    def spin(name: bytes) -> None:
        libc.prctl(15, name, 0, 0, 0)  # PR_SET_NAME
        t = time.thread_time()
        while time.thread_time() - t < 0.3:
            pass
        stop.wait(30)

    threads = [threading.Thread(target=spin, args=(n,)) for n in (b"probe-x_0", b"probe-x_1")]
    for th in threads:
        th.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = thread_jiffies(os.getpid())
            if got.get("probe-x", 0) * 0.01 >= 0.5:
                break
            time.sleep(0.05)
        assert "probe-x_0" not in got and got.get("probe-x", 0) > 0
    finally:
        stop.set()
        for th in threads:
            th.join()


def test_the_rows_show_each_roles_cpu_and_each_apps_device_time() -> None:
    a, b = RunResult("unmanaged"), RunResult("managed")
    a.cpu_roles = {"contended": {"llm": 0.9, "embedder": 0.8}}
    b.cpu_roles = {"contended": {"llm": 0.1, "embedder": 0.3, "driver": 1.4}}
    b.host_threads = {"contended": {"npu-bg": 1.1}}
    b.device = {"llm": DeviceUse(steps=200, busy_s=1.0, seconds=1.0)}
    cells = {r[0]: r[1:] for r in rows([a, b])}
    assert cells["CPU contended: llm (cores)"] == ("0.90", "0.10")
    assert cells["CPU contended: driver (cores)"] == ("-", "1.40")
    assert cells["CPU contended: driver thread npu-bg"] == ("-", "1.10")
    assert cells["device llm: busy / steps/s / mean step, latency p50 (ms)"] == (
        "-", "1.00 dev / 200 steps/s / 5.00 ms (p90 nan), lat nan")
    assert "CPU contended: voice (cores)" not in cells


def test_host_name_tells_a_background_lane_from_its_main_host() -> None:
    """Both hosts of a device with background_host run ``npu driver NAME``: the lane's
    host config (``"lane": "background"``) names it ``NAME.background`` in the bench's
    per-host CPU rows."""
    import subprocess
    import sys

    from npumanager.demo.contention_probe import host_name

    code = "import time; time.sleep(30)"
    procs = [subprocess.Popen([sys.executable, "-c", code, "driver", "ref", *extra])
             for extra in ([], ['{"lane": "background"}'], ['{"lane": ""}'])]
    try:
        for p in procs:  # just forked, a child has its parent's command line until exec
            deadline = time.monotonic() + 10
            while host_name(p.pid) == str(p.pid) and time.monotonic() < deadline:
                time.sleep(0.01)
        assert [host_name(p.pid) for p in procs] == ["ref", "ref.background", "ref"]
    finally:
        for p in procs:
            p.kill()
            p.wait()
