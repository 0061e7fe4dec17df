"""Foreground protection is config and `npu serve` flag only (service/protection.py): no
call an app makes changes it. With it off, a FOREGROUND app of another uid gets no real-time
thread and its BACKGROUND request starts no background lane: its grant names the device's
one host, and npud runs no second one."""

from __future__ import annotations

from pathlib import Path

import pytest

from npumanager import Importance, ModelLoadRequest, ModelPriority, NpuManager
from npumanager.testing import procs
from tests.security.conftest import StartDaemon
from tests.security.harness import ATTACKER, Lifecycle, needs_root
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
