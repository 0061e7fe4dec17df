"""The compile child's starvation bound through npud, on the product path: a real npud
(root), its reference host as the unprivileged driver user, which may not leave SCHED_IDLE
itself (root here lacks CAP_SYS_RESOURCE, so the host's RLIMIT_NICE stays 0), and a
BACKGROUND app's prepare whose compile child is kept from its CPU by two normal-priority
busy loops on that CPU (``load_cpus = "last"`` pins the child there; the loops run only
inside the test). At SCHED_IDLE the child would get ~0.15 % of that CPU (minutes for
ONNX Runtime's import alone); npud raises it on the host's request
(service/host_raise.py) and the prepare completes; ``device.stats``' ``compile_child``
says how. The same for a session built on the lowered pool and for a compile on the
host's own lowered thread (``background_compile = "thread"``), which npud watches
(service/host_compile_watch.py)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from npumanager.hal.wire import SERVICE
from npumanager.paths import driver_socket
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.testing import procs
from npumanager.testing.daemon import driver_hosts
from npumanager.testing.onnx_models import matmul_model
from npumanager.testing.spinners import spin_every_cpu
from npumanager.testing.spinners import stop as stop_spinning
from npumanager.wire.client import SyncRpcClient
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import granted, outcome
from tests.security.harness import BYSTANDER, needs_root

pytestmark = [needs_root, pytest.mark.timeout(300)]

STARVE_MS = 100
#: The session is then built from the child's artifacts at normal priority (on the same
#: CPU): what is bounded here is the compile child's wait, not the host thread's
#: (drivers/compile_watch.py).
DRIVER = [{"name": "reference", "plugin": "reference", "background_sched": "idle",
           "background_starve_ms": STARVE_MS, "load_cpus": "last", "quiet_window_us": 0,
           "background_load": "normal", "compile_raise": "npud"}]


#: The default: the session built on the lowered pool, which npud watches for the host.
LOWERED = [{**DRIVER[0], "background_load": "lowered"}]
#: The compile in the host itself, on its lowered compile pool (as torch's, OpenVINO's and
#: the external-data path's are): npud watches the compiling thread and its children.
IN_HOST = [{**LOWERED[0], "background_compile": "thread"}]


def background_prepare(rt: str) -> str:
    """As a background uid: prepare a model (compiled in the host's compile child)."""
    with granted(rt) as (dev, grant):
        return outcome(lambda: dev.prepare_model(matmul_model(dim=256, depth=4),
                                                 grant=grant) and "prepared")


def stats(rt: str) -> dict[str, Any]:
    rpc = SyncRpcClient(str(driver_socket("reference", rt)), SERVICE)
    try:
        payload, _ = rpc.call("device.stats", Empty())  # root: an admin
        return dict(json.loads(payload))
    finally:
        rpc.close()


@pytest.mark.parametrize("driver", [DRIVER, LOWERED, IN_HOST],
                         ids=["load-normal", "load-lowered", "compile-in-host"])
def test_a_starved_compile_child_is_raised_through_npud_and_the_prepare_completes(
        start_npud: StartDaemon, runtime_dir: Path, driver: list[dict[str, Any]]) -> None:
    start_npud(drivers=True, driver=driver)
    rt = str(runtime_dir)
    [host] = driver_hosts(runtime_dir)
    limits = Path(f"/proc/{host}/limits").read_text().splitlines()
    [nice] = [line for line in limits if line.startswith("Max nice priority")]
    if nice.split()[3] != "0":
        pytest.skip("the host may raise its compile child itself here (RLIMIT_NICE set)")
    assert os.stat(f"/proc/{host}").st_uid != 0
    cpu = max(os.sched_getaffinity(0))
    loops: list[Any] = []

    def spin_on_cpu() -> None:  # (affinity is per thread: the loops inherit this one's)
        os.sched_setaffinity(0, {cpu})
        loops.extend(spin_every_cpu(2))

    try:
        s = threading.Thread(target=spin_on_cpu)
        s.start()
        s.join(60)
        assert len(loops) == 2
        t0 = time.monotonic()
        got = procs.run_as(BYSTANDER, None, background_prepare, rt, timeout=240)
        took = time.monotonic() - t0
    finally:
        stop_spinning(loops)
    assert got == "ok: prepared", got
    st = stats(rt)
    print(f"prepare {took:.1f} s", st["compile_child"], st["compile_thread"],
          st["compile_raises"])
    child, raised, here = st["compile_child"], st["compile_raises"], st["compile_thread"]
    assert raised["raised_npud"] >= 1 and raised["raised_self"] == 0, raised
    assert here["raises"] == 0, here  # (npud's watch decides, not the host's)
    if driver is IN_HOST:  # no compile child: the compile ran on the host's thread
        assert child is None and here["watched_by_npud"] == 1, st
        return
    assert child["starve_ms"] == STARVE_MS and child["via"] == "npud", child
    assert child["raises"] >= 1, child
    # The session built on the lowered pool: watched by npud (its raises are counted in
    # raised_npud with the child's).
    assert here["watched_by_npud"] == (1 if driver is LOWERED else 0), here
