"""A device's background lane ([[driver]] background_host; service/host_lanes.py) under
real uids: its socket is a second door to the device, and it must be no wider than the
first. An app cannot prepare there without a grant npud told that host (none, a made-up
one, another uid's, or its own NORMAL one), cannot reach another uid's model there,
cannot tell the lane about a grant itself (hal.* is npud's), and, a foreground app, cannot
put its BACKGROUND load in the device's main host (the grant is valid on the lane only): a
background model in the foreground's host is what the lane exists to keep out."""

from __future__ import annotations

import os
from pathlib import Path

from npumanager import ModelLoadRequest, ModelPriority, NpuManager, nn
from npumanager.constants import Importance
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import X, outcome
from tests.security.harness import ATTACKER, BYSTANDER, Lifecycle, needs_root

pytestmark = needs_root

LANE = "background"
DRIVER = [{"name": "reference", "plugin": "reference", "background_sched": "normal",
           "grant_wait_s": 0.2, "background_host": True}]


def victim(runtime_dir: str) -> list[str]:
    """As the bystander: a BACKGROUND model on the lane; announce its id and grant; keep
    executing it when asked."""
    out = []
    with NpuManager(runtime_dir, client_name="victim") as mgr:
        req = ModelLoadRequest(1, priority=ModelPriority.BACKGROUND)
        cb = Lifecycle()
        mgr.request_can_load_model(req, cb)
        cb.wait_for("CAN_LOAD_NOW")
        dev = nn.device("reference", runtime_dir)
        model = dev.prepare_model(add_model(4, 1.0), grant=cb.listener)
        out.append(model.device.socket_path)
        procs.announce(("model", model.model_id, cb.listener.grant_id))
        while procs.receive(timeout=60) == "execute":
            out.append(outcome(lambda: model.execute({"x": X})["y"].ravel().tolist()))
            procs.announce("executed")
        dev.close()
    return out


def attack(runtime_dir: str, victim_model: int, victim_grant: str) -> dict[str, str]:
    """As the attacker: every way in through the lane's socket, and its own BACKGROUND
    grant taken to the main host."""
    got: dict[str, str] = {}
    dev = nn.device("reference", runtime_dir)
    lane = dev.lane(LANE)
    try:
        got["no grant"] = outcome(lambda: lane.prepare_model(add_model(), grant=None))
        got["made-up grant"] = outcome(lambda: lane.prepare_model(add_model(), grant="f" * 32))
        got["victim's grant"] = outcome(lambda: lane.prepare_model(add_model(),
                                                                   grant=victim_grant))
        got["tell the lane"] = outcome(lambda: lane.call(
            lane.connection(), "hal.grant_issued",
            pb.GrantIssued(uid=os.getuid(), request_id=7, grant_id="e" * 32)))
        with NpuManager(runtime_dir, client_name="attacker") as mgr:
            normal, background = Lifecycle(), Lifecycle()
            mgr.request_can_load_model(ModelLoadRequest(5), normal)
            mgr.request_can_load_model(
                ModelLoadRequest(6, priority=ModelPriority.BACKGROUND), background)
            normal.wait_for("CAN_LOAD_NOW")
            background.wait_for("CAN_LOAD_NOW")
            got["lanes"] = f"{normal.listener.lane!r} {background.listener.lane!r}"
            # Its own NORMAL grant on the lane; its BACKGROUND grant on the main host.
            got["normal on the lane"] = outcome(lambda: lane.prepare_model(
                add_model(), grant=normal.listener.grant_id))
            got["background on main"] = outcome(lambda: dev.prepare_model(
                add_model(), grant=background.listener.grant_id))
            # Its own model on the lane, then the victim's id under it.
            mine = dev.prepare_model(add_model(4, 100.0), grant=background.listener)
            got["own on"] = mine.device.socket_path
            own_id = mine.model_id
            mine.model_id = victim_model
            got["victim's model"] = outcome(lambda: mine.execute({"x": X}))
            mine.model_id = own_id
            got["own"] = outcome(lambda: mine.execute({"x": X})["y"].ravel().tolist())
    finally:
        dev.close()
    return got


def test_the_lane_is_no_wider_a_door_than_the_main_host(start_npud: StartDaemon,
                                                        runtime_dir: Path) -> None:
    npud = start_npud(drivers=True, driver=DRIVER)
    rt = str(runtime_dir)
    # The attacker as a foreground app: its NORMAL grant is the main host's (an unknown
    # uid's would be the lane's too: tests/security/test_lane_routing.py).
    with NpuManager(rt) as admin:
        admin.set_uid_importance(ATTACKER, Importance.FOREGROUND)
    lane_sock = str(runtime_dir / "drivers" / "reference.background.sock")
    bystander = procs.spawn_as(BYSTANDER, None, victim, rt, timeout=120)
    try:
        _, model_id, grant_id = bystander.expect(
            lambda e: isinstance(e, tuple) and e[0] == "model", 60)
        got = procs.run_as(ATTACKER, None, attack, rt, model_id, grant_id, timeout=90)
        bystander.send("execute")  # untouched by all of it
        bystander.expect("executed", 30)
        bystander.send("done")
        out = bystander.wait(60)
    finally:
        bystander.kill()
    assert out == [lane_sock, "ok: [1.0, 2.0, 3.0, 4.0]"], out
    assert got["no grant"].startswith("GrantRequired: "), got
    for key in ("made-up grant", "normal on the lane"):
        assert got[key].startswith("GrantRequired: driver reference does not know grant"), got
        assert "background lane, for BACKGROUND" in got[key], got
    # Another uid's grant, told to the lane: bound to that uid there as on any host.
    assert got["victim's grant"] == f"GrantRequired: that grant was not issued to uid " \
        f"{ATTACKER}", got
    assert got["tell the lane"].startswith("PermissionDenied: hal.grant_issued is for npud"), got
    assert got["lanes"] == "'' 'background'", got
    assert got["background on main"].startswith("GrantRequired: "), got
    assert "background lane only" in got["background on main"], got
    assert got["own on"] == lane_sock, got
    assert got["victim's model"] == f"InvalidArgument: no prepared model {model_id} on this " \
        "connection", got
    assert got["own"] == "ok: [100.0, 101.0, 102.0, 103.0]", got
    assert "Traceback" not in npud.output
