"""Attack 8 (driver side): using or reading another app's model in a driver.

``model_for`` in the driver host checked ownership with an expression that was always
true: any connection could name any model id (they are small integers) and, once that
model's grant was revoked, read the revoked model's message (its grant and why it
ended). Now a model belongs to the connection that prepared it: under any other
connection, even of the same uid, execute, cancel and release answer as if the id had
never existed, before and after a revocation; the owner's model is untouched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from npumanager import ModelLoadRequest, NpuManager, nn
from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import X, granted, outcome
from tests.security.harness import (
    ATTACKER,
    BYSTANDER,
    Lifecycle,
    assert_device_served,
    needs_root,
)

pytestmark = needs_root


def owner(runtime_dir: str) -> list[str]:
    """As the victim: prepare a model, announce its id, keep executing it whenever the test
    asks; then end the grant (the driver revokes the model) and say so."""
    out = []
    with NpuManager(runtime_dir, client_name="victim") as mgr:
        req = ModelLoadRequest(id=1)
        cb = Lifecycle()
        mgr.request_can_load_model(req, cb)
        cb.wait_for("CAN_LOAD_NOW")
        dev = nn.device("reference", runtime_dir)
        model = dev.prepare_model(add_model(4, 1.0), grant=cb.listener)
        procs.announce(("model", model.model_id))
        while procs.receive(timeout=60) == "execute":
            out.append(outcome(lambda: model.execute({"x": X})["y"].ravel().tolist()))
            procs.announce("executed")
        cb.listener.notify_model_unloaded(req)
        cb.wait_for("COMPLETE")
        out.append(outcome(lambda: model.execute({"x": X})))  # revoked now: its owner hears
        procs.announce("revoked")
        procs.receive(timeout=60)
        dev.close()
    return out


def intrude(runtime_dir: str, victim_model: int, also_release: bool) -> dict[str, str]:
    """As the attacker: a model of its own, then every call with the victim's model id."""
    with granted(runtime_dir, request_id=9) as (dev, grant):
        mine = dev.prepare_model(add_model(4, 100.0), grant=grant)
        own_id = mine.model_id
        mine.model_id = victim_model
        got = {
            "execute": outcome(lambda: mine.execute({"x": X})),
            "cancel": outcome(mine.cancel),
        }
        if also_release:
            got["release"] = outcome(lambda: dev.call(
                mine._rpc, "device.release", _release(victim_model)) and None)
        mine.model_id = own_id
        got["own"] = outcome(lambda: mine.execute({"x": X})["y"].ravel().tolist())
        mine.release()
        return got


def _release(model_id: int) -> Any:
    from npumanager.proto.v1 import driver_pb2 as pb

    return pb.Release(model_id=model_id)


def test_another_uid_can_neither_use_nor_read_a_model_even_once_revoked(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True)
    rt = str(runtime_dir)
    victim = procs.spawn_as(BYSTANDER, None, owner, rt, timeout=120)
    try:
        _, model_id = victim.expect(lambda e: isinstance(e, tuple) and e[0] == "model", 60)
        nothing = f"InvalidArgument: no prepared model {model_id} on this connection"
        got = procs.run_as(ATTACKER, None, intrude, rt, model_id, True, timeout=60)
        assert got["execute"] == nothing, got
        # Cancel and release of an id this connection does not hold do nothing at all.
        assert got["cancel"] == got["release"] == "ok: None", got
        assert got["own"] == "ok: [100.0, 101.0, 102.0, 103.0]", got
        victim.send("execute")  # the release above released nothing
        victim.expect("executed", 30)
        victim.send("revoke")
        victim.expect("revoked", 30)
        # Revoked: its owner hears GrantRevoked and why; anyone else, nothing at all.
        got = procs.run_as(ATTACKER, None, intrude, rt, model_id, False, timeout=60)
        assert got["execute"] == nothing, got
        victim.send("done")
        out = victim.wait(60)
    finally:
        victim.kill()
    assert out[0] == "ok: [1.0, 2.0, 3.0, 4.0]", out
    assert out[1].startswith("GrantRevoked: "), out
    assert_device_served(runtime_dir)
