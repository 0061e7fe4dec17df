"""Attack 7: the orphaned driver. After npud was SIGKILLed its driver kept serving
connected clients "until they leave", and still accepted new prepares under the dead
npud's grants: outside any budget or revocation.

Now, once the manager link drops, the driver loads nothing new (NoManagerAttached, for
any uid and any grant), keeps running the models already loaded for ``[manager]
orphan_grace_s`` (inference survives an npud crash), then releases them all and exits
(a new npud starts its own host on the same socket path). Here the grace is a few
seconds; the test waits for the driver's own states (device.stats, its pid), never for
time to pass."""

from __future__ import annotations

import os
import select
from pathlib import Path

import pytest

from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import X, granted, outcome, wait_until
from tests.security.harness import (
    ATTACKER,
    BYSTANDER,
    assert_device_served,
    driver_pid,
    needs_root,
)
from tests.security.test_endless_jobs import driver_load

pytestmark = needs_root

#: Long enough for the checks made within it, even on a loaded machine.
GRACE_S = 6.0


def loaded_app(runtime_dir: str, bias: float, request_id: int) -> list[str]:
    """A model prepared under a live grant; then, each time the test asks, one execute and
    one new prepare under the same grant (after npud died: the dead npud's grant)."""
    out = []
    with granted(runtime_dir, request_id) as (dev, grant):
        model = dev.prepare_model(add_model(4, bias), grant=grant)
        procs.announce("loaded")
        while procs.receive(timeout=120) == "try":
            out.append(outcome(lambda: model.execute({"x": X})["y"].ravel().tolist()))
            out.append(outcome(lambda: dev.prepare_model(add_model(4, 7.0), grant=grant)))
            procs.announce(len(out))
    return out


def _exited(pid: int, timeout: float) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], timeout)[0])
    finally:
        os.close(fd)


def test_an_orphaned_driver_loads_nothing_new_and_releases_after_the_grace(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud(drivers=True, manager={"orphan_grace_s": GRACE_S})
    rt = str(runtime_dir)
    drv = driver_pid(runtime_dir)
    victim = procs.spawn_as(BYSTANDER, None, loaded_app, rt, 1.0, 1, timeout=180)
    attacker = procs.spawn_as(ATTACKER, None, loaded_app, rt, 100.0, 2, timeout=180)
    try:
        victim.expect("loaded", 60)
        attacker.expect("loaded", 60)
        assert driver_load(runtime_dir)["orphaned_s"] is None
        npud.proc.kill()  # type: ignore[union-attr]
        npud.proc.wait(10)  # type: ignore[union-attr]
        wait_until(lambda: driver_load(runtime_dir)["orphaned_s"] is not None, 30,
                   "the driver to see npud gone")
        attacker.send("try")
        attacker.expect(2, 30)
        victim.send("try")
        victim.expect(2, 30)
        # Within the grace: loaded models still run; nothing new loads.
        assert driver_load(runtime_dir)["orphaned_s"] < GRACE_S, "the checks took too long"
        assert _exited(drv, 60), "the orphaned driver did not release and exit"
        for child in (attacker, victim):
            child.send("try")
            child.expect(4, 30)
            child.send("done")
        got = {"attacker": attacker.wait(60), "victim": victim.wait(60)}
    finally:
        victim.kill()
        attacker.kill()
    refused = ("NoManagerAttached: driver reference has no manager attached (npud went away ")
    for who, first in (("attacker", "[100.0, 101.0, 102.0, 103.0]"),
                       ("victim", "[1.0, 2.0, 3.0, 4.0]")):
        out = got[who]
        assert out[0] == f"ok: {first}", (who, out)
        assert out[1].startswith(refused) and "loads nothing new until npud is back" in out[1]
        # After the grace the host released everything and is gone.
        assert out[2].startswith("DeviceUnavailable"), (who, out)
        assert not out[3].startswith("ok"), (who, out)
    # A new npud starts a new host on the same paths and serves everyone again.
    start_npud(drivers=True)
    assert_device_served(runtime_dir)


def claim_the_orphan(runtime_dir: str) -> dict[str, str]:
    """As another uid, on the orphaned host's socket: speak for npud (attach as its
    manager with admission off, a grant of its own, every uid made foreground)."""
    from npumanager.errors import NpuError
    from npumanager.hal.wire import SERVICE
    from npumanager.paths import driver_socket
    from npumanager.proto.v1 import driver_pb2 as pb
    from npumanager.proto.v1.wire_pb2 import Empty
    from npumanager.wire.client import SyncRpcClient

    rpc = SyncRpcClient(str(driver_socket("reference", runtime_dir)), SERVICE)
    got: dict[str, str] = {}
    try:
        for method, msg in (("hal.attach_manager", pb.AttachManager(enforce_admission=False)),
                            ("hal.set_callback", pb.SetCallback(debounce_ms=0)),
                            ("hal.grant_issued", Empty()),
                            ("hal.set_scheduling_configs", Empty())):
            try:
                rpc.call(method, msg)
                got[method] = "ok"
            except NpuError as exc:
                got[method] = f"{type(exc).__name__}: {exc}"
    finally:
        rpc.close()
    return got


#: The attacker's four calls come within it on a loaded machine (a fork and four round
#: trips; GRACE_S above covers two apps' executes and prepares). Were they late, the host
#: would be gone and the test would fail on their answers, never pass; the test waits
#: out the whole grace, so a longer one only made it slower (30 s: 34 s in a full suite).
ADOPT_GRACE_S = 10.0


@pytest.mark.timeout(400)  # (the grace, two npuds, on a loaded machine)
def test_another_uid_cannot_adopt_an_orphaned_driver(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    """npud SIGKILLed, its host waits out the orphan grace for a new npud: another uid that
    connects first and speaks for npud is refused every manager call, the host stays
    orphaned and goes at the end of its grace."""
    npud = start_npud(drivers=True, manager={"orphan_grace_s": ADOPT_GRACE_S})
    rt = str(runtime_dir)
    drv = driver_pid(runtime_dir)
    npud.proc.kill()  # type: ignore[union-attr]
    npud.proc.wait(10)  # type: ignore[union-attr]
    wait_until(lambda: driver_load(runtime_dir)["orphaned_s"] is not None, 30,
               "the driver to see npud gone")
    got = procs.run_as(ATTACKER, None, claim_the_orphan, rt, timeout=60)
    assert len(got) == 4, got
    for method, answer in got.items():
        assert answer.startswith(f"PermissionDenied: {method} is for npud and admins only "
                                 f"(uid {ATTACKER} is neither)"), got
    assert driver_load(runtime_dir)["orphaned_s"] is not None, "someone adopted it"
    assert _exited(drv, 120), "the orphaned driver did not release and exit"
    start_npud(drivers=True)
    assert_device_served(runtime_dir)
