"""npud derives a client's importance from its real process (nice), re-checks it, and acts.

Clients run as other uids (forked with npumanager.testing.procs, needs root); npud has
``[importance] from_process = true``.
"""

from __future__ import annotations

import os
import queue
import time
from pathlib import Path
from typing import Any

import pytest

from npumanager.client import ModelLoadRequest, ModelLoadRequestCallback, NpuManager
from npumanager.constants import Importance, LoadStatus, ThermalStatus
from npumanager.testing import procs
from npumanager.testing.daemon import DaemonProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.getuid() != 0, reason="clients under other uids need root"),
]

APP_UID = 50071


def niced_app(runtime_dir: str, nice: int) -> list[tuple[str, str]]:
    """Runs as APP_UID: renice itself, hold one model, report callbacks until told to exit."""
    os.nice(nice)
    events: queue.Queue[tuple[str, str]] = queue.Queue()

    class Cb(ModelLoadRequestCallback):
        def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
            if status == LoadStatus.CAN_LOAD_NOW:
                listener.notify_model_loaded(request)
            events.put(("can_load", status.name))

        def on_request_unload_model(self, request: Any, reason: Any) -> None:
            events.put(("unload", reason.name))

    with NpuManager(runtime_dir) as mgr:
        mgr.request_can_load_model(ModelLoadRequest(id=1), Cb())
        procs.receive(timeout=30)  # "exit"
    out = []
    while not events.empty():
        out.append(events.get())
    return out


def importance_of(mgr: NpuManager, uid: int) -> int | None:
    entry = mgr.dump().get("uids", {}).get(str(uid))
    return None if entry is None else int(entry["importance"])


def wait_importance(mgr: NpuManager, uid: int, want: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while importance_of(mgr, uid) != want:
        if time.monotonic() > deadline:
            raise TimeoutError(f"uid {uid} importance {importance_of(mgr, uid)}, want {want}")
        time.sleep(0.02)


def test_nice_of_real_client_sets_and_updates_its_importance(runtime_dir: Path) -> None:
    config = {
        "policy": {"name": "STATUS_QUO"},
        "importance": {"from_process": True, "recheck_interval_s": 0.05},
    }
    with DaemonProcess(runtime_dir, config) as npud, NpuManager(runtime_dir) as admin:
        with procs.spawn_as(APP_UID, None, niced_app, str(runtime_dir), 10) as app:
            wait_importance(admin, APP_UID, int(Importance.CACHED))
            # Hot: a CACHED holder is asked to leave.
            admin.override_thermal_status(ThermalStatus.SEVERE)
            # The kernel now says the app matters (the admin lowers its nice value): the
            # periodic re-check sees it.
            os.setpriority(os.PRIO_PROCESS, app.pid, -5)
            wait_importance(admin, APP_UID, int(Importance.FOREGROUND_SERVICE))
            admin.reset_thermal_status()
            app.send("exit")
            seen = app.wait(timeout=20)
        assert ("can_load", "CAN_LOAD_NOW") in seen
        assert ("unload", "THERMAL") in seen
    assert npud.returncode == 0
