"""Foreground protection is config and `npu serve` flag only (service/protection.py): no
call an app makes changes it. With it off, a FOREGROUND app of another uid gets no real-time
thread and its BACKGROUND request starts no background lane: its grant names the device's
one host, and npud runs no second one. With it on, such an app's model load on the lane runs
at nice 19 (background_load_nice, load28), the lane's step workers' weight, and no higher:
more CPU than SCHED_IDLE gave it, never more than the foreground's threads (nice 0, or
SCHED_FIFO), and another app is still served."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from npumanager import Importance, ModelLoadRequest, ModelPriority, NpuManager
from npumanager.testing import procs
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.onnx_models import add_model
from npumanager.testing.thread_sched import children, thread_scheds
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import prepare_outcomes
from tests.security.harness import ATTACKER, Lifecycle, assert_device_served, needs_root
from tests.security.test_app_realtime import burst_realtime

pytestmark = [needs_root, pytest.mark.slow]


def background_grant_lane(rt: str) -> str:
    """As the app: a BACKGROUND request granted; the lane its grant names."""
    with NpuManager(rt, client_name="app") as mgr:
        req = ModelLoadRequest(7, priority=ModelPriority.BACKGROUND)
        cb = Lifecycle()
        mgr.request_can_load_model(req, cb)
        cb.wait_for("CAN_LOAD_NOW", 30)
        lane = str(cb.listener.lane)
        cb.listener.notify_model_unloaded(req)
        return lane


def test_an_app_cannot_get_what_protection_off_withholds(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud(drivers=True)  # (DaemonProcess: --protect-foreground off)
    assert npud.count_output('foreground protection: off (protect_foreground = "off")') == 1
    rt = str(runtime_dir)
    with NpuManager(rt) as admin:
        admin.set_uid_importance(ATTACKER, Importance.FOREGROUND)
    got = procs.run_as(ATTACKER, None, burst_realtime, rt, timeout=60)
    assert got == {"y": [1.0, 2.0, 3.0, 4.0], "granted": False, "fifo": False,
                   "error": "RealtimeUnavailable", "after_close": True}, got
    assert procs.run_as(ATTACKER, None, background_grant_lane, rt, timeout=60) == ""
    with NpuManager(rt) as admin:
        dump = admin.dump()
    assert "background" not in dump["devices"][0]["hosts"]
    assert dump["daemon"]["protection"] == \
        'foreground protection: off (protect_foreground = "off")'
    assert "background lane" not in npud.output


def compile_child(host_pid: int) -> int:
    """The host's compile child (drivers/compile_worker.py)."""
    for pid in children(host_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"compile_worker" in f.read():
                    return pid
        except OSError:
            continue
    raise AssertionError(f"host {host_pid} has no compile child")


def test_a_background_apps_load_on_the_lane_runs_at_nice_19_and_no_higher(
        runtime_dir: Path, state_dir: Path) -> None:
    # The product's background_sched ("idle"), named: the test helpers' hosts run background
    # work at normal priority otherwise (tests/conftest.py), where the key changes nothing.
    # The lane's step workers are at nice 19 here (background_step_nice): none starves.
    cfg = {"manager": {"log_level": "info"},
           "driver": [{"name": "reference", "plugin": "reference", "background_sched": "idle"}]}
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    with DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60,
                       protect_foreground="on") as npud:
        assert npud.wait_for_output("driver reference (background lane) is up", 30), \
            npud.output
        rt = str(runtime_dir)
        assert procs.run_as(ATTACKER, None, background_grant_lane, rt, timeout=60) == \
            "background"
        # An unknown uid is BACKGROUND: its model compiles in the lane's compile child.
        got = procs.run_as(ATTACKER, None, prepare_outcomes, rt, [add_model()], timeout=90)
        assert got == ["ok: [1.0, 2.0, 3.0, 4.0]"], got
        with NpuManager(rt) as admin:
            lane_pid = int(admin.dump()["devices"][0]["hosts"]["background"]["pid"])
        child = thread_scheds(compile_child(lane_pid))
        assert child and set(child.values()) == {(os.SCHED_OTHER, 19)}, child
        build = thread_scheds(lane_pid, "npu-bgcompile")
        assert build and set(build.values()) == {(os.SCHED_OTHER, 19)}, build
        assert_device_served(runtime_dir)
    assert "Traceback" not in npud.output
