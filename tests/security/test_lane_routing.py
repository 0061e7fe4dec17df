"""A device's background lane routes by the request's effective class, under real uids
(service/host_lanes.grant_target): an app whose uid's importance is a background one,
set by the admin, that asks with a NORMAL model priority gets a grant valid on the lane
only. The main host, where a foreground stream's burst thread runs, refuses it, so the
app cannot put its load there by asking NORMAL. Raised to FOREGROUND later by the admin,
the grant moves to the main host (service/grant_moves.py): the loaded model keeps serving
on the lane until the app's runtime has prepared it on the main host, then the lane frees
it; the app's next request's grant is the main host's."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from npumanager import ModelLoadRequest, NpuManager, nn
from npumanager.constants import Importance
from npumanager.hal.wire import SERVICE
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model
from npumanager.wire.client import SyncRpcClient
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import X, outcome
from tests.security.harness import ATTACKER, BYSTANDER, Lifecycle, needs_root

pytestmark = needs_root

DRIVER = [{"name": "reference", "plugin": "reference", "background_sched": "normal",
           "grant_wait_s": 0.2, "background_host": True}]


def held(socket_path: Path) -> list[tuple[int, int]]:
    """(uid, request id) of each grant holding a model in a host (root's device.stats)."""
    rpc = SyncRpcClient(str(socket_path), SERVICE, threaded=False, client_name="test")
    try:
        payload, _ = rpc.call("device.stats", Empty())
    finally:
        rpc.close()
    return sorted((g["uid"], g["request_id"]) for g in json.loads(payload)["held"]
                  if g["models"])


def background_app(runtime_dir: str) -> dict[str, str]:
    """As a uid the admin made CACHED: a NORMAL request, its grant taken to the main host,
    then its model on the lane; once the admin raised it to FOREGROUND, that model again
    and a second NORMAL request's grant."""
    got: dict[str, str] = {}
    with NpuManager(runtime_dir, client_name="background-app") as mgr:
        first = Lifecycle()
        mgr.request_can_load_model(ModelLoadRequest(1), first)  # NORMAL
        first.wait_for("CAN_LOAD_NOW")
        got["lane"] = first.listener.lane
        dev = nn.device("reference", runtime_dir)
        try:
            got["on main"] = outcome(lambda: dev.prepare_model(
                add_model(), grant=first.listener.grant_id))  # (a bare id: the main host)
            model = dev.prepare_model(add_model(4, 1.0), grant=first.listener)
            got["model on"] = model.device.socket_path
            got["run"] = outcome(lambda: model.execute({"x": X})["y"].ravel().tolist())
            procs.announce("loaded")
            assert procs.receive(timeout=60) == "raised"
            got["run raised"] = outcome(lambda: model.execute({"x": X})["y"].ravel().tolist())
            got["raised on"] = model.lane  # still the lane: served there, it said moved
            deadline = time.monotonic() + 60
            while model.lane != "" and time.monotonic() < deadline:
                got["run moving"] = outcome(
                    lambda: model.execute({"x": X})["y"].ravel().tolist())
                time.sleep(0.02)
            got["moved to"] = model.lane
            second = Lifecycle()
            mgr.request_can_load_model(ModelLoadRequest(2), second)
            second.wait_for("CAN_LOAD_NOW")
            got["second lane"] = second.listener.lane
            got["second on"] = dev.prepare_model(add_model(), grant=second.listener
                                                 ).device.socket_path
            procs.announce("second")
            assert procs.receive(timeout=60) == "done"
        finally:
            dev.close()
    return got


def test_a_background_importance_apps_normal_request_is_the_lanes(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud(drivers=True, driver=DRIVER)
    rt = str(runtime_dir)
    main_sock = runtime_dir / "drivers" / "reference.sock"
    lane_sock = runtime_dir / "drivers" / "reference.background.sock"
    with NpuManager(rt) as admin:
        admin.set_uid_importance(ATTACKER, Importance.CACHED)
        app = procs.spawn_as(ATTACKER, None, background_app, rt, timeout=120)
        try:
            app.expect("loaded", 60)
            # Which process holds the model: the lane, not the stream's host.
            assert (held(main_sock), held(lane_sock)) == ([], [(ATTACKER, 1)])
            admin.set_uid_importance(ATTACKER, Importance.FOREGROUND)
            app.send("raised")
            app.expect("second", 60)
            assert (held(main_sock), held(lane_sock)) == ([(ATTACKER, 1), (ATTACKER, 2)], [])
            app.send("done")
            got: dict[str, Any] = app.wait(60)
        finally:
            app.kill()
    assert got["lane"] == "background", got
    assert got["on main"].startswith("GrantRequired: driver reference does not know grant"), got
    assert "background lane only" in got["on main"], got
    assert got["model on"] == str(lane_sock), got
    assert got["run"] == "ok: [1.0, 2.0, 3.0, 4.0]", got
    # Raised to FOREGROUND: the loaded model served on the lane, then followed its grant
    # to the main host; the next grant is the main host's.
    assert got["run raised"] == "ok: [1.0, 2.0, 3.0, 4.0]", got
    assert (got["raised on"], got["moved to"]) == ("background", ""), got
    assert got.get("run moving", "ok: [1.0, 2.0, 3.0, 4.0]") == "ok: [1.0, 2.0, 3.0, 4.0]", got
    assert (got["second lane"], got["second on"]) == ("", str(main_sock)), got
    assert "Traceback" not in npud.output


def unknown_app(runtime_dir: str) -> tuple[str, str]:
    """As a uid npud knows nothing of (importance GONE, the drivers' priority 1000): a
    NORMAL request's lane and where its model runs."""
    with NpuManager(runtime_dir, client_name="unknown-app") as mgr:
        cb = Lifecycle()
        mgr.request_can_load_model(ModelLoadRequest(1), cb)
        cb.wait_for("CAN_LOAD_NOW")
        dev = nn.device("reference", runtime_dir)
        try:
            model = dev.prepare_model(add_model(), grant=cb.listener)
            return cb.listener.lane, model.device.socket_path
        finally:
            dev.close()


def test_an_unknown_uids_normal_request_is_the_lanes(start_npud: StartDaemon,
                                                     runtime_dir: Path) -> None:
    """The drivers run an unknown uid's work as BACKGROUND (app priority 1000): its load
    belongs on the lane too."""
    start_npud(drivers=True, driver=DRIVER)
    lane, where = procs.run_as(BYSTANDER, None, unknown_app, str(runtime_dir), timeout=90)
    assert (lane, where) == ("background", str(runtime_dir / "drivers" /
                                               "reference.background.sock"))
