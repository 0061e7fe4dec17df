"""Attack 10: the quiet window and the execution classes, abused.

With ``quiet_window_us`` on, no background step starts while a paced foreground
stream's frame runs (drivers/quiet.py). Two ways to turn that into a hold on every other
uid's background work:

- look foreground: a uid npud knows nothing about is BACKGROUND (app priority 1000); it
  claims the most important job priority there is and another uid's identity. Its job
  priority is clamped into its band, the identity refused (AttributionDenied): its work
  stays background and never takes the channel kept for foreground work.
- be foreground (npud ranks the uid so), pace a stream until the driver believes its
  period, then send one "frame" that never ends (a job of a million steps on the
  stream's model and connection). That frame held every background step of every uid for
  as long as it ran; now for one period from its arrival at most: another uid's
  background job runs to its end beside it."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import NpuManager
from npumanager.testing import procs
from npumanager.testing.onnx_models import step_model
from tests.security.burst_apps import driver_load
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import granted, outcome, wait_until
from tests.security.harness import ATTACKER, BYSTANDER, assert_device_served, needs_root

pytestmark = [needs_root, pytest.mark.timeout(400)]  # (a loaded 2-core machine: minutes)

#: ``channels`` channels, one kept for foreground work; a 2 ms quiet window; background
#: work at normal CPU priority (conftest.py says why).
def quiet(channels: int) -> list[dict[str, Any]]:
    return [{"name": "reference", "plugin": "reference", "channels": channels,
             "reserved_channels": 1, "quiet_window_us": 2000, "background_sched": "normal"}]
ZERO = np.zeros((1, 4), np.float32)


def endless(model: Any, result: dict[str, str], key: str, **kw: Any) -> threading.Thread:
    def run() -> None:
        result[key] = outcome(lambda: model.execute(
            {"state": ZERO}, steps=1_000_000, feedback={"state_out": "state"}, **kw))

    t = threading.Thread(target=run)
    t.start()
    return t


def claims_foreground(rt: str) -> dict[str, Any]:
    """As a uid npud does not know: the most important job priority there is, another
    uid's (root's) identity, and two endless jobs at the most important priority."""
    with granted(rt) as (dev, grant):
        a = dev.prepare_model(step_model(4), grant=grant)
        b = dev.prepare_model(step_model(4), grant=grant)
        got: dict[str, Any] = {"as root": outcome(lambda: a.execute({"state": ZERO},
                                                                    original_uid=0))}
        with a.burst() as burst:
            got["burst as root"] = outcome(lambda: burst.execute({"state": ZERO},
                                                                 original_uid=0))
        threads = [endless(m, got, k, job_priority=-(1 << 31))
                   for m, k in ((a, "first"), (b, "second"))]
        procs.announce("running")
        procs.receive(timeout=120)
        a.cancel()
        b.cancel()
        for t in threads:
            t.join(60)
        return got


def test_a_background_uid_cannot_make_itself_foreground(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True, driver=quiet(2))
    rt = str(runtime_dir)
    app = procs.spawn_as(ATTACKER, None, claims_foreground, rt, timeout=180)
    try:
        app.expect("running", 60)
        # One of its endless jobs runs on the shared channel, the other waits: the channel
        # kept for foreground work is not its to take, whatever priority it claims.
        wait_until(lambda: (lambda s: s["busy"] == 1 and s["queued"] >= 1)(driver_load(rt)),
                   60, "one job running and one queued", lambda: driver_load(rt))
        # A foreground uid is served on the kept channel meanwhile.
        with NpuManager(rt) as admin:
            admin.set_uid_importance(BYSTANDER, 100)
        assert_device_served(runtime_dir)
        assert driver_load(rt)["busy"] == 1  # (its execution over: the kept one free again)
        app.send("stop")
        got = app.wait(120)
    finally:
        app.kill()
    assert got["as root"].startswith("AttributionDenied"), got
    assert got["burst as root"].startswith("AttributionDenied"), got
    assert got["first"].startswith("WorkCancelled") and got["second"].startswith(
        "WorkCancelled"), got


def paced_then_endless(rt: str) -> dict[str, Any]:
    """As a foreground uid: a stream at 100 Hz through a burst until told, then one frame of
    a million steps on the same model and connection, until told; then cancel it."""
    with granted(rt) as (dev, grant):
        model = dev.prepare_model(step_model(4), grant=grant)
        got: dict[str, Any] = {}
        with model.burst() as b:
            frames = 0
            nxt = time.monotonic()
            while frames < 40:
                b.execute({"state": ZERO})
                frames += 1
                nxt += 0.01
                time.sleep(max(0.0, nxt - time.monotonic()))
            t = endless(model, got, "endless")
            procs.announce("endless")
            procs.receive(timeout=120)
            model.cancel()
            t.join(60)
        got["frames"] = frames
        return got


def background_job(rt: str, steps: int) -> list[float]:
    """As a background uid: one job of ``steps`` steps (state + 1 each) to its end."""
    with granted(rt, request_id=2) as (dev, grant):
        model = dev.prepare_model(step_model(4), grant=grant)
        out = model.execute({"state": ZERO}, steps=steps, feedback={"state_out": "state"})
        return [float(v) for v in out["state_out"].ravel()]


def test_an_endless_foreground_frame_does_not_hold_background_work_forever(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    # Three channels: the frame takes one, background work keeps another.
    start_npud(drivers=True, driver=quiet(3))
    rt = str(runtime_dir)
    with NpuManager(rt) as admin:
        admin.set_uid_importance(ATTACKER, 100)  # foreground
    app = procs.spawn_as(ATTACKER, None, paced_then_endless, rt, timeout=240)
    try:
        app.expect("endless", 90)
        wait_until(lambda: driver_load(rt)["busy"] >= 1, 60, "the endless frame running")
        # Another uid's background job runs its 200 steps to the end beside the frame (it
        # held them all while it ran).
        out = procs.run_as(BYSTANDER, None, background_job, rt, 200, timeout=120)
        app.send("stop")
        got = app.wait(120)
    finally:
        app.kill()
    assert out == [200.0] * 4, out
    assert got["frames"] == 40 and got["endless"].startswith("WorkCancelled"), got
    assert_device_served(runtime_dir)
