"""Attack 11: starve another uid's background work by keeping the CPUs busy.

The driver runs background steps on SCHED_IDLE threads (``background_sched = "idle"``,
the default): the kernel gives them a core only when no normal thread wants it. A
foreground uid that keeps every CPU busy at normal priority — a stream of executions in
the driver, and its own processes spinning — left another uid's background job crawling
at a few percent of one core for as long as it liked. Now a background step that waited
past ``background_starve_ms`` makes the next one run at normal priority
(drivers/starve.py): the other uid's job runs to its end, with steps moved, counted in
the driver's ``device.stats``."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import NpuManager
from npumanager.hal.wire import SERVICE
from npumanager.paths import driver_socket
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.testing import procs
from npumanager.testing.onnx_models import step_model
from npumanager.testing.spinners import spin_every_cpu
from npumanager.testing.spinners import stop as stop_spinning
from npumanager.wire.client import SyncRpcClient
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import granted, outcome
from tests.security.harness import ATTACKER, BYSTANDER, assert_device_served, needs_root

pytestmark = [needs_root, pytest.mark.timeout(400)]

STEPS = 30
#: Three channels, one kept for foreground work; SCHED_IDLE background threads with a
#: 50 ms bound; no quiet window (the stream is not paced: nothing else holds the job).
DRIVER = [{"name": "reference", "plugin": "reference", "channels": 3, "reserved_channels": 1,
           "background_sched": "idle", "background_starve_ms": 50, "quiet_window_us": 0}]
ZERO = np.zeros((1, 4), np.float32)


def busy_foreground(rt: str) -> dict[str, Any]:
    """As a foreground uid: executions back to back in the driver, and a process spinning
    on every CPU, until told."""
    with granted(rt) as (dev, grant):
        model = dev.prepare_model(step_model(4, work_dim=128, work_depth=2), grant=grant)
        stop = threading.Event()
        got: dict[str, Any] = {"runs": 0}

        def stream() -> None:
            while not stop.is_set():
                got["last"] = outcome(lambda: model.execute({"state": ZERO}))
                got["runs"] += 1

        t = threading.Thread(target=stream)
        t.start()
        # "busy" only once every loop spins: a loop still starting up (seconds on a loaded
        # machine) left the other uid's job the CPUs, and the counters at 0.
        spin = spin_every_cpu()
        try:
            procs.announce("busy")
            procs.receive(timeout=300)
        finally:
            stop_spinning(spin)
            stop.set()
            t.join(60)
        return got


def background_job(rt: str) -> list[float]:
    """As a background uid: prepare (before the CPUs are taken), then on "go" one job of
    ``STEPS`` steps (state + 1 each) to its end."""
    with granted(rt, request_id=2) as (dev, grant):
        # A step of ~10 ms of CPU: at SCHED_IDLE beside the busy loops it waits well past the
        # 50 ms bound. A 160-wide chain (~1 ms) waited ~30 ms a step, so in some runs no step
        # of the 30 crossed the bound and the counters stayed 0 (seen in a full run beside
        # other work).
        model = dev.prepare_model(step_model(4, work_dim=320, work_depth=4), grant=grant)
        procs.announce("prepared")
        procs.receive(timeout=120)
        out = model.execute({"state": ZERO}, steps=STEPS, feedback={"state_out": "state"})
        return [float(v) for v in out["state_out"].ravel()]


def background_counts(rt: str) -> dict[str, Any]:
    rpc = SyncRpcClient(str(driver_socket("reference", rt)), SERVICE)
    try:
        payload, _ = rpc.call("device.stats", Empty())  # root: an admin
        return dict(json.loads(payload)["background"])
    finally:
        rpc.close()


def test_a_busy_foreground_uid_cannot_starve_another_uids_background_job(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True, driver=DRIVER)
    rt = str(runtime_dir)
    with NpuManager(rt) as admin:
        admin.set_uid_importance(ATTACKER, 100)  # foreground; BYSTANDER stays background
    bg = procs.spawn_as(BYSTANDER, None, background_job, rt, timeout=360)
    fg = None
    try:
        bg.expect("prepared", 120)
        fg = procs.spawn_as(ATTACKER, None, busy_foreground, rt, timeout=360)
        fg.expect("busy", 120)
        bg.send("go")
        out = bg.wait(300)  # it ends: what is checked (no timing beyond a generous bound)
        fg.send("stop")
        got = fg.wait(120)
    finally:
        bg.kill()
        if fg is not None:
            fg.kill()
    assert out == [float(STEPS)] * 4, out
    assert got["runs"] > 0 and got["last"].startswith("ok"), got
    counts = background_counts(rt)
    assert counts["starved"] >= 1 and counts["boosted"] >= 1, counts
    assert_device_served(runtime_dir)
