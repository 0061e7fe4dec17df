"""A device with a background lane ([[driver]] background_host; service/host_lanes.py),
with a real npud, two real reference driver hosts and real sockets: one device in
``nn.devices()``, two host processes; a BACKGROUND request's model is prepared in the
second one and a NORMAL one's in the first; a grant is refused on the other host (naming
the lane); both hosts' models count against the device's one budget; a revoked
background model is released by the lane; the lane SIGKILLed is restarted while the
device and its foreground model keep serving."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import ModelLoadRequest, ModelPriority, ModelSize, NpuManager, nn
from npumanager.errors import DeviceUnavailable, GrantRequired, GrantRevoked
from npumanager.hal.wire import SERVICE
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.testing.daemon import DaemonProcess, driver_hosts
from npumanager.testing.onnx_models import add_model
from npumanager.wire.client import SyncRpcClient
from tests.security.harness import Lifecycle

pytestmark = pytest.mark.slow

BG = ModelPriority.BACKGROUND
BIG = ModelSize.GREATER_THAN_2G
X = np.ones((1, 4), np.float32)
LANE_UP = "driver reference (background lane) is up"


def lane_config(**manager: Any) -> dict[str, Any]:
    return {"manager": {"unload_deadline_s": 1.0, **manager},
            "policy": {"name": "BUDGET", "max_budget": 4},
            "driver": [{"name": "reference", "plugin": "reference", "channels": 2,
                        "grant_wait_s": 0.2, "background_host": True,
                        # the lane's own keys ([driver.background]): one channel there
                        "background": {"channels": 1}}]}


@pytest.fixture
def npud(runtime_dir: Path, state_dir: Path) -> Iterator[DaemonProcess]:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    with DaemonProcess(runtime_dir, lane_config(), drivers=True, env=env,
                       ready_timeout=60) as d:
        yield d


def wait_until(cond: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = cond()
        except Exception:  # (npud restarting: the SDK reconnecting)
            got = None
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def stats(socket_path: str | Path) -> dict[str, Any]:
    """A host's device.stats (root is an admin): its pid, lane and the grants it holds."""
    rpc = SyncRpcClient(str(socket_path), SERVICE, threaded=False, client_name="test")
    try:
        payload, _ = rpc.call("device.stats", Empty())
    finally:
        rpc.close()
    out: dict[str, Any] = json.loads(payload)
    return out


def held_requests(socket_path: str | Path) -> list[int]:
    return sorted(g["request_id"] for g in stats(socket_path)["held"] if g["models"])


def grant(mgr: NpuManager, rid: int, priority: ModelPriority = ModelPriority.NORMAL,
          size: ModelSize = ModelSize.LESS_THAN_1GB) -> tuple[ModelLoadRequest, Lifecycle]:
    req = ModelLoadRequest(rid, size, priority)
    cb = Lifecycle()
    mgr.request_can_load_model(req, cb)
    cb.wait_for("CAN_LOAD_NOW", 30)
    return req, cb


def lane_sock(runtime_dir: Path) -> Path:
    return runtime_dir / "drivers" / "reference.background.sock"


def test_one_device_two_hosts_each_model_in_its_lane(npud: DaemonProcess,
                                                     runtime_dir: Path) -> None:
    devs = nn.devices(runtime_dir)
    assert [(d.name, d.number) for d in devs] == [("reference", 0)]  # one device
    for d in devs:
        d.close()
    main_sock = runtime_dir / "drivers" / "reference.sock"
    assert lane_sock(runtime_dir).exists()
    with NpuManager(runtime_dir) as mgr:
        [device] = mgr.dump()["devices"]
        hosts = device["hosts"]
        main_pid, bg_pid = hosts["pid"], hosts["background"]["pid"]
        assert main_pid != bg_pid and {main_pid, bg_pid} <= set(driver_hosts(runtime_dir))
        assert stats(main_sock)["pid"] == main_pid and stats(main_sock)["lane"] == ""
        assert stats(lane_sock(runtime_dir))["pid"] == bg_pid
        assert stats(lane_sock(runtime_dir))["lane"] == "background"
        # [driver.background] reached the lane's host only.
        assert (stats(main_sock)["channels"], stats(lane_sock(runtime_dir))["channels"]) == (
            2, 1)

        fg_req, fg = grant(mgr, 1)
        bg_req, bg = grant(mgr, 2, BG)
        assert (fg.listener.lane, bg.listener.lane) == ("", "background")
        dev = nn.device("reference", runtime_dir)
        try:
            fg_model = dev.prepare_model(add_model(), grant=fg.listener)
            bg_model = dev.prepare_model(add_model(), grant=bg.listener)
            assert bg_model.device.socket_path == str(lane_sock(runtime_dir))
            assert fg_model.device.socket_path == str(main_sock)
            np.testing.assert_array_equal(fg_model.execute({"x": X})["y"], X + 1)
            np.testing.assert_array_equal(bg_model.execute({"x": X})["y"], X + 1)
            with bg_model.burst() as b:  # the burst too runs in the lane's host
                np.testing.assert_array_equal(b.execute({"x": X})["y"], X + 1)
            # Which process holds which model: the lane the background one.
            assert held_requests(main_sock) == [1]
            assert held_requests(lane_sock(runtime_dir)) == [2]
            # A grant is valid on its own host only: refused on the other, naming the lane.
            with pytest.raises(GrantRequired, match="background lane only"):
                dev.prepare_model(add_model(), grant=bg.listener.grant_id)  # (a bare id)
            with pytest.raises(GrantRequired, match="background lane, for BACKGROUND"):
                dev.lane("background").prepare_model(add_model(), grant=fg.listener.grant_id)
            # The background model's release is the lane's: COMPLETE once it applied it.
            bg.listener.notify_model_unloaded(bg_req)
            bg.wait_for("COMPLETE", 30)
            with pytest.raises(GrantRevoked):
                bg_model.execute({"x": X})
            assert held_requests(lane_sock(runtime_dir)) == []
            np.testing.assert_array_equal(fg_model.execute({"x": X})["y"], X + 1)
            fg.listener.notify_model_unloaded(fg_req)
            fg.wait_for("COMPLETE", 30)
        finally:
            dev.close()
    assert "Traceback" not in npud.output


def test_both_hosts_count_against_the_one_budget(npud: DaemonProcess,
                                                 runtime_dir: Path) -> None:
    with NpuManager(runtime_dir) as mgr:
        [budget] = mgr.dump()["budgets"]  # one budget for the device, not one per host
        assert budget["device"] == "reference"
        fg_req, fg = grant(mgr, 1, size=ModelSize.BETWEEN_1GB_AND_2GB)  # weight 2
        bg_req, bg = grant(mgr, 2, BG, size=ModelSize.BETWEEN_1GB_AND_2GB)  # 2 more: full
        assert mgr.dump()["budgets"][0]["used"] == 4
        dev = nn.device("reference", runtime_dir)
        try:
            dev.prepare_model(add_model(), grant=fg.listener)
            bg_model = dev.prepare_model(add_model(), grant=bg.listener)
            # A second BACKGROUND load does not fit: queued, as with one host.
            late = Lifecycle()
            late_req = ModelLoadRequest(3, BIG, BG)
            mgr.request_can_load_model(late_req, late)
            late.wait_for("NOT_PRIORITIZED", 30)
            assert "CAN_LOAD_NOW" not in late.seen
            # The lane's model unloads: the queued one is granted on the lane.
            bg_model.release()
            bg.listener.notify_model_unloaded(bg_req)
            bg.wait_for("COMPLETE", 30)
            fg.listener.notify_model_unloaded(fg_req)
            late.wait_for("CAN_LOAD_NOW", 30)
            assert late.listener.lane == "background"
            model = dev.prepare_model(add_model(), grant=late.listener)
            np.testing.assert_array_equal(model.execute({"x": X})["y"], X + 1)
            assert held_requests(lane_sock(runtime_dir)) == [3]
        finally:
            dev.close()


def test_a_revoked_background_model_is_released_by_the_lane(npud: DaemonProcess,
                                                            runtime_dir: Path) -> None:
    with NpuManager(runtime_dir) as mgr:
        _req, bg = grant(mgr, 1, BG)
        dev = nn.device("reference", runtime_dir)
        try:
            model = dev.prepare_model(add_model(), grant=bg.listener)
            assert held_requests(lane_sock(runtime_dir)) == [1]
            # SEVERE asks every holder ranked above PERCEPTIBLE to unload; this app does
            # not, so its grant is revoked at the unload deadline (1 s).
            mgr.override_thermal_status(3)  # SEVERE
            try:
                bg.wait_for("REVOKED", 30)
            finally:
                mgr.reset_thermal_status()
            # The lane released it (REVOKED waits for its acknowledgement): refused there.
            assert held_requests(lane_sock(runtime_dir)) == []
            with pytest.raises(GrantRevoked):
                model.execute({"x": X})
            assert mgr.dump()["ending"] == []
        finally:
            dev.close()
    assert "did not acknowledge" not in npud.output


def test_the_lane_sigkilled_is_restarted_and_the_device_keeps_serving(
        npud: DaemonProcess, runtime_dir: Path) -> None:
    with NpuManager(runtime_dir) as mgr:
        bg_pid = mgr.dump()["devices"][0]["hosts"]["background"]["pid"]
        main_pid = mgr.dump()["devices"][0]["hosts"]["pid"]
        _fg_req, fg = grant(mgr, 1)
        _bg_req, bg = grant(mgr, 2, BG)
        dev = nn.device("reference", runtime_dir)
        try:
            fg_model = dev.prepare_model(add_model(), grant=fg.listener)
            bg_model = dev.prepare_model(add_model(), grant=bg.listener)
            ups = npud.count_output(LANE_UP)
            os.kill(bg_pid, signal.SIGKILL)
            # The foreground keeps serving while the lane is down and restarting.
            wait_until(lambda: (np.testing.assert_array_equal(
                fg_model.execute({"x": X})["y"], X + 1) is None
                and npud.count_output(LANE_UP) > ups), "the lane back", 60)
            with pytest.raises(DeviceUnavailable):
                bg_model.execute({"x": X})  # its host is gone, and its models with it
            dump = mgr.dump()
            [device] = dump["devices"]
            assert device["available"] and device["hosts"]["pid"] == main_pid
            new_bg = device["hosts"]["background"]["pid"]
            assert new_bg not in (0, bg_pid)
            # The grants stay (as after any host crash): the app prepares again on the new
            # lane under the same grant, told to it when it attached.
            again = dev.prepare_model(add_model(), grant=bg.listener)
            np.testing.assert_array_equal(again.execute({"x": X})["y"], X + 1)
            assert stats(lane_sock(runtime_dir))["pid"] == new_bg
            assert {r["request_id"]: r["state"] for r in dump["requests"]} == {
                1: "loaded", 2: "loaded"}
            np.testing.assert_array_equal(fg_model.execute({"x": X})["y"], X + 1)
        finally:
            dev.close()
    assert "driver reference down" not in npud.output  # the device never went down


def test_a_restarted_npud_adopts_both_hosts(runtime_dir: Path, state_dir: Path) -> None:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    cfg = lane_config(adopt_grace_s=5.0)
    first = DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60).start()
    second: DaemonProcess | None = None
    try:
        with NpuManager(runtime_dir) as mgr:
            hosts = mgr.dump()["devices"][0]["hosts"]
            _fg_req, fg = grant(mgr, 1)
            bg_req, bg = grant(mgr, 2, BG)
            dev = nn.device("reference", runtime_dir)
            try:
                fg_model = dev.prepare_model(add_model(), grant=fg.listener)
                bg_model = dev.prepare_model(add_model(), grant=bg.listener)
                first.signal(signal.SIGKILL)
                assert first.proc is not None
                first.proc.wait(10)
                second = DaemonProcess(runtime_dir, cfg, drivers=True, env=env,
                                       ready_timeout=60).start()
                # The SDK re-registers; npud adopts each grant from the host holding it.
                wait_until(lambda: {r["request_id"]: r["state"]
                                    for r in mgr.dump()["requests"]} == {1: "loaded",
                                                                          2: "loaded"},
                           "both requests adopted as loaded")
                assert mgr.dump()["devices"][0]["hosts"] == hosts  # the same two processes
                for model in (fg_model, bg_model):
                    np.testing.assert_array_equal(model.execute({"x": X})["y"], X + 1)
                # The adopted lane's release still answers the app.
                bg.listener.notify_model_unloaded(bg_req)
                bg.wait_for("COMPLETE", 30)
                with pytest.raises(GrantRevoked):
                    bg_model.execute({"x": X})
            finally:
                dev.close()
    finally:
        if second is not None:
            second.stop()
        if first.proc is not None and first.proc.poll() is None:
            first.proc.kill()
        first._cleanup()
    assert second is not None
    assert "driver reference adopted" in second.output
    assert "driver reference (background lane) adopted" in second.output
    assert "Traceback" not in second.output


def test_a_hung_lane_is_killed_for_its_unacknowledged_end_not_the_main_host(
        runtime_dir: Path, state_dir: Path) -> None:
    """npud's state restarts a device's driver when an end is not acknowledged in time
    (service/ending.py): with a lane, the host that owes it (host_lanes._hung)."""
    import contextlib

    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    cfg = lane_config(grant_end_ack_s=4.0)
    with DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60) as npud, \
            NpuManager(runtime_dir) as mgr:
        hosts = mgr.dump()["devices"][0]["hosts"]
        _fg_req, fg = grant(mgr, 1)
        bg_req, bg = grant(mgr, 2, BG)
        dev = nn.device("reference", runtime_dir)
        try:
            fg_model = dev.prepare_model(add_model(), grant=fg.listener)
            dev.prepare_model(add_model(), grant=bg.listener)
            ups = npud.count_output(LANE_UP)
            os.kill(hosts["background"]["pid"], signal.SIGSTOP)  # hung: acknowledges nothing
            try:
                bg.listener.notify_model_unloaded(bg_req)
                bg.wait_for("COMPLETE", 60)  # after the deadline, the lane killed
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(hosts["background"]["pid"], signal.SIGCONT)
            assert npud.wait_for_output("did not acknowledge the end of grant", 30)
            wait_until(lambda: npud.count_output(LANE_UP) > ups, "the lane back", 60)
            after = mgr.dump()["devices"][0]["hosts"]
            assert after["pid"] == hosts["pid"]  # the main host was left alone
            assert after["background"]["pid"] not in (0, hosts["background"]["pid"])
            np.testing.assert_array_equal(fg_model.execute({"x": X})["y"], X + 1)
        finally:
            dev.close()


def test_memory_counts_the_device_once_and_admits_both_hosts_against_it(
        runtime_dir: Path, state_dir: Path) -> None:
    """MEMORY: the budget is the device's memory (its main host's capabilities; the lane's
    are not reported), and models on both hosts are charged against it."""
    gib = 1 << 30
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    cfg = lane_config()
    cfg["policy"] = {"name": "MEMORY"}
    cfg["driver"][0]["options"] = {"memory_bytes": 4 * gib}
    with DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60), \
            NpuManager(runtime_dir) as mgr:
        [budget] = mgr.dump()["budgets"]
        assert (budget["memory_bytes"], budget["total"]) == (4 * gib, 4 * gib)  # not 8
        _fg_req, fg = grant(mgr, 1, size=ModelSize.BETWEEN_1GB_AND_2GB)  # 2 GiB declared
        _bg_req, bg = grant(mgr, 2, BG, size=ModelSize.BETWEEN_1GB_AND_2GB)  # 2 more: full
        dev = nn.device("reference", runtime_dir)
        try:
            dev.prepare_model(add_model(), grant=fg.listener)
            bg_model = dev.prepare_model(add_model(), grant=bg.listener)
            assert bg_model.device.socket_path == str(lane_sock(runtime_dir))
            assert mgr.dump()["budgets"][0]["used"] == 4 * gib
            late = Lifecycle()
            mgr.request_can_load_model(ModelLoadRequest(3, priority=BG), late)  # 1 GiB
            late.wait_for("NOT_PRIORITIZED", 30)
            assert "CAN_LOAD_NOW" not in late.seen
        finally:
            dev.close()


def test_the_async_clients_lease_takes_the_model_to_the_lane(npud: DaemonProcess,
                                                              runtime_dir: Path) -> None:
    """AsyncNpuManager.reserve: the lease's listener carries the lane as the sync one's."""
    import asyncio

    from npumanager import AsyncNpuManager

    async def run() -> tuple[str, str]:
        mgr = await AsyncNpuManager.connect(runtime_dir)
        try:
            async with mgr.reserve(ModelLoadRequest(1, priority=BG)) as lease:
                dev = nn.device("reference", runtime_dir)
                try:
                    model = await asyncio.to_thread(dev.prepare_model, add_model(),
                                                    grant=lease)
                    y = await asyncio.to_thread(model.execute, {"x": X})
                    np.testing.assert_array_equal(y["y"], X + 1)
                    return lease.listener.lane, model.device.socket_path
                finally:
                    dev.close()
        finally:
            await mgr.close()

    assert asyncio.run(run()) == ("background", str(lane_sock(runtime_dir)))
