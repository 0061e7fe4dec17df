"""Attack 11: the load hold (drivers/load_hold.py, ``hold_loads``), abused.

With the hold on, a foreground uid's paced stream stops *another uid's* background
compile (its compile child gets SIGSTOP) around each frame. A foreground uid that paces
a fast stream (400 Hz) for as long as a bystander's background load takes cannot turn
that into a denial of service: each stop ends within one period (a timer the driver's
state always has armed) and after a stop the child runs at least as long as it was
stopped, so the bystander's load completes and its model computes the right outputs,
and the stopped time is at most about half of the load's."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import NpuManager
from npumanager.testing import procs
from npumanager.testing.onnx_models import matmul_model, matmul_reference, step_model
from tests.security.burst_apps import driver_load
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import granted
from tests.security.harness import ATTACKER, BYSTANDER, assert_device_served, needs_root

pytestmark = [needs_root, pytest.mark.timeout(400)]  # (a loaded 2-core machine: minutes)

#: 3 channels, 1 kept for foreground work, a 1 ms window that holds loads; background
#: work at normal CPU priority (conftest.py says why).
DRIVER = [{"name": "reference", "plugin": "reference", "channels": 3, "reserved_channels": 1,
           "quiet_window_us": 1000, "hold_loads": True, "background_sched": "normal"}]
ZERO = np.zeros((1, 4), np.float32)
DIM, DEPTH = 512, 8  # 8 MiB of weights: a compile that takes a while


def fast_stream(rt: str) -> dict[str, Any]:
    """As a foreground uid: frames at 400 Hz through a burst until told to stop."""
    stop = threading.Event()

    def until_told() -> None:
        procs.receive(timeout=300)
        stop.set()

    threading.Thread(target=until_told, daemon=True).start()
    with granted(rt) as (dev, grant):
        model = dev.prepare_model(step_model(4), grant=grant)
        frames = 0
        with model.burst() as b:
            nxt = time.monotonic()
            while not stop.is_set():
                b.execute({"state": ZERO})
                frames += 1
                if frames == 40:
                    procs.announce("paced")
                nxt = max(nxt + 0.0025, time.monotonic())
                stop.wait(max(0.0, nxt - time.monotonic()))
        return {"frames": frames}


def background_load(rt: str) -> dict[str, Any]:
    """As a background uid: load a model (timed), then run it once."""
    with granted(rt, request_id=2) as (dev, grant):
        t0 = time.monotonic()
        model = dev.prepare_model(matmul_model(DIM, DEPTH), grant=grant)
        load_s = time.monotonic() - t0
        x = np.ones((16, DIM), np.float32)
        return {"load_s": load_s, "y": model.execute({"x": x})["y"].tolist()}


def test_a_fast_foreground_stream_cannot_hold_another_uids_load_forever(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True, driver=DRIVER)
    rt = str(runtime_dir)
    with NpuManager(rt) as admin:
        admin.set_uid_importance(ATTACKER, 100)  # foreground
    app = procs.spawn_as(ATTACKER, None, fast_stream, rt, timeout=300)
    try:
        app.expect("paced", 90)
        before = driver_load(rt)["load_hold"]
        got = procs.run_as(BYSTANDER, None, background_load, rt, timeout=240)
        hold = driver_load(rt)["load_hold"]
        app.send("stop")
        frames = app.wait(120)["frames"]
    finally:
        app.kill()
    x = np.ones((16, DIM), np.float32)
    np.testing.assert_allclose(np.asarray(got["y"], np.float32),
                               matmul_reference(x, DIM, DEPTH), rtol=1e-4, atol=1e-5)
    assert frames > 40
    # The stops took at most about half of the load (plus the last stop): the duty
    # bound, on the driver's own clock. (The child gets a signal for the stops made
    # while it exists: it starts with the first compile.)
    stopped = hold["stopped_s"] - before["stopped_s"]
    assert hold["signalled"] <= hold["stops"], hold
    assert stopped <= got["load_s"] / 2 + hold["longest_ms"] / 1000 + 0.01, (hold, got)
    assert_device_served(runtime_dir)
