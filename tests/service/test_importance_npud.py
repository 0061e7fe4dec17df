"""npud derives a client's importance from its real process (nice), re-checks it, and acts.

Clients run as other uids (forked with npumanager.testing.procs, needs root); npud has
``[importance] from_process = true``.
"""

from __future__ import annotations

import os
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


def niced_app(runtime_dir: str, nice: int) -> list[tuple[str, int, str]]:
    """Runs as APP_UID: renice itself, hold one model, announce every callback; on
    "request" asks for a second model; returns what it saw on "exit"."""
    os.nice(nice)
    events: list[tuple[str, int, str]] = []

    def seen(event: tuple[str, int, str]) -> None:
        events.append(event)
        procs.announce(event)

    class Cb(ModelLoadRequestCallback):
        def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
            if status == LoadStatus.CAN_LOAD_NOW:
                listener.notify_model_loaded(request)
            seen(("can_load", request.id, status.name))

        def on_request_unload_model(self, request: Any, reason: Any) -> None:
            seen(("unload", request.id, reason.name))

    with NpuManager(runtime_dir) as mgr:
        mgr.request_can_load_model(ModelLoadRequest(id=1), Cb())
        while procs.receive(timeout=30) != "exit":
            mgr.request_can_load_model(ModelLoadRequest(id=2), Cb())
    return events


def importance_of(mgr: NpuManager, uid: int) -> int | None:
    entry = mgr.dump().get("uids", {}).get(str(uid))
    return None if entry is None else int(entry["importance"])


def test_nice_of_real_client_sets_and_updates_its_importance(runtime_dir: Path) -> None:
    config = {
        "policy": {"name": "STATUS_QUO"},
        "importance": {"from_process": True, "recheck_interval_s": 0.05},
    }
    with DaemonProcess(runtime_dir, config) as npud, NpuManager(runtime_dir) as admin:
        with procs.spawn_as(APP_UID, None, niced_app, str(runtime_dir), 10) as app:
            # npud read the app's nice value at its first request, before answering it.
            app.expect(("can_load", 1, "CAN_LOAD_NOW"))
            assert importance_of(admin, APP_UID) == int(Importance.CACHED)
            # Hot: a CACHED holder is asked to leave, and a new CACHED request waits.
            admin.override_thermal_status(ThermalStatus.SEVERE)
            app.expect(("unload", 1, "THERMAL"))
            app.send("request")
            app.expect(("can_load", 2, "NOT_PRIORITIZED"))
            # The kernel now says the app matters (the admin lowers its nice value): the
            # periodic re-check sees it, and the waiting request is let in.
            os.setpriority(os.PRIO_PROCESS, app.pid, -5)
            app.expect(("can_load", 2, "CAN_LOAD_NOW"))
            assert importance_of(admin, APP_UID) == int(Importance.FOREGROUND_SERVICE)
            admin.reset_thermal_status()
            app.send("exit")
            seen = app.wait(timeout=20)
        assert seen == [("can_load", 1, "CAN_LOAD_NOW"), ("unload", 1, "THERMAL"),
                        ("can_load", 2, "NOT_PRIORITIZED"), ("can_load", 2, "CAN_LOAD_NOW")]
    assert npud.returncode == 0
