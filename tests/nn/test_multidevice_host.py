"""One driver host serving two devices under a real npud.

The [[driver]] entry ``ref`` lists ``devices = ["a", "b"]``: npud starts one reference
driver host process that serves ``ref:a`` and ``ref:b`` (API.md "Devices and budgets":
``DRIVER:DEVICE`` when a driver has several devices). The reference driver's devices are
logical: ONNX Runtime on the same CPU cores, each with its own budget, socket, channel,
run queue, grants and cache map (this machine has no second accelerator; OpenVINO's
GPU/NPU take the same path with another device string).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import (
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelPriority,
    ModelSize,
    NpuManager,
    nn,
)
from npumanager.errors import GrantRequired, NpuError, ServiceUnavailable
from npumanager.hal.wire import SERVICE
from npumanager.paths import driver_socket
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.onnx_models import add_model
from npumanager.testing.procs import spawn_as
from npumanager.wire.client import SyncRpcClient

from ..integration.apps import scripted_app

pytestmark = pytest.mark.slow

A, B = "ref:a", "ref:b"
BG_UID = 50002
BIG = ModelSize.GREATER_THAN_2G


@pytest.fixture
def npud(runtime_dir: Path, state_dir: Path) -> Iterator[DaemonProcess]:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    cfg = {
        "policy": {"name": "BUDGET", "max_budget": 4},
        "driver": [{"name": "ref", "plugin": "reference", "channels": 1,
                    "grant_wait_s": 0.2, "options": {"devices": ["a", "b"]}}],
    }
    with DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60) as d:
        yield d


class Answers(ModelLoadRequestCallback):
    def __init__(self) -> None:
        self.statuses: list[LoadStatus] = []
        self.listener: Any = None
        self.changed = threading.Condition()

    def on_can_load_model(self, request: Any, status: LoadStatus, listener: Any) -> None:
        with self.changed:
            self.statuses.append(status)
            self.listener = listener
            self.changed.notify_all()

    def wait(self, status: LoadStatus) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: status in self.statuses, 10), self.statuses


def _driver_hosts(npud_pid: int) -> list[tuple[int, list[str]]]:
    """npud's driver host children: (pid, command line)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == npud_pid and "driver" in argv:
            out.append((int(entry.name), argv))
    return out


def _stats(runtime_dir: Path, device: str) -> dict[str, Any]:
    """A device's channels busy and jobs queued (device.stats: npud's uid is an admin)."""
    rpc = SyncRpcClient(str(driver_socket(device, runtime_dir)), SERVICE)
    try:
        payload, _ = rpc.call("device.stats", Empty())
        return dict(json.loads(payload))
    finally:
        rpc.close()


def _wait(pred: Any, what: str, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, what
        time.sleep(0.02)


def test_one_host_serves_two_devices_with_a_budget_and_grants_each(
        npud: DaemonProcess, runtime_dir: Path) -> None:
    devs = nn.devices(runtime_dir)
    assert [(d.name, d.number) for d in devs] == [(A, 0), (B, 1)]
    for d in devs:
        d.close()
    # One process serves both devices' sockets (npud bound them and handed both over).
    hosts = _driver_hosts(npud.pid)
    assert len(hosts) == 1, hosts
    argv = hosts[0][1]
    assert argv[argv.index("driver") + 1] == "ref" and argv.count("--listen-fd") == 2, argv
    with NpuManager.connect(runtime_dir) as mgr:
        on_a, on_b = Answers(), Answers()
        mgr.request_can_load_model(ModelLoadRequest(1, BIG, device=A), on_a)
        mgr.request_can_load_model(ModelLoadRequest(2, BIG, device=B), on_b)
        on_a.wait(LoadStatus.CAN_LOAD_NOW)  # each fills its own device's budget of 4
        on_b.wait(LoadStatus.CAN_LOAD_NOW)
        assert {b["device"]: b["used"] for b in mgr.dump()["budgets"]} == {A: 4, B: 4}
        x = np.zeros((1, 4), np.float32)
        with nn.device(A, runtime_dir) as dev_a, nn.device(B, runtime_dir) as dev_b:
            with pytest.raises(GrantRequired):  # B's grant means nothing to device A
                dev_a.prepare_model(add_model(), grant=on_b.listener)
            with pytest.raises(GrantRequired):
                dev_b.prepare_model(add_model(), grant=on_a.listener)
            for dev, ans in ((dev_a, on_a), (dev_b, on_b)):
                model = dev.prepare_model(add_model(), grant=ans.listener)
                np.testing.assert_array_equal(model.execute({"x": x})["y"], x + 1)
                model.release()
            assert "logical device a" in dev_a.capabilities.backend
        status = subprocess.run(
            [sys.executable, "-m", "npumanager", "status", "--runtime-dir", str(runtime_dir)],
            capture_output=True, text=True, timeout=60)
        assert status.returncode == 0, status.stderr
        assert f"{A}: 4 of 4 used" in status.stdout, status.stdout
        assert f"{B}: 4 of 4 used" in status.stdout, status.stdout


@pytest.mark.skipif(os.getuid() != 0, reason="the background app runs as another uid")
def test_a_background_holder_on_one_device_is_not_asked_to_unload_for_the_other(
        npud: DaemonProcess, runtime_dir: Path) -> None:
    """A background model (another uid's) holds device A's whole budget; a foreground
    request for device B is granted without asking it anything; the same request for
    device A does ask it to unload (the policy preempts on its own device)."""
    with spawn_as(BG_UID, None, scripted_app, runtime_dir,
                  [(1, BIG, ModelPriority.BACKGROUND, A)], until="exit") as app, \
            NpuManager.connect(runtime_dir) as mgr:
        app.expect(("loaded", 1))
        fg_b, fg_a = Answers(), Answers()
        mgr.request_can_load_model(ModelLoadRequest(2, BIG, device=B), fg_b)
        fg_b.wait(LoadStatus.CAN_LOAD_NOW)
        states = {(r["uid"], r["request_id"]): r["state"] for r in mgr.dump()["requests"]}
        assert states[(BG_UID, 1)] == "loaded", states
        mgr.request_can_load_model(ModelLoadRequest(3, BIG, device=A), fg_a)
        app.expect(("unload", 1, "PREEMPTED"))
        fg_a.wait(LoadStatus.CAN_LOAD_NOW)
        app.send(("exit",))
        events = app.wait()
    assert [e for e in events if e[0] == "unload"] == [("unload", 1, "PREEMPTED")], events


def test_one_devices_busy_channel_does_not_hold_back_the_others_work(
        npud: DaemonProcess, runtime_dir: Path) -> None:
    """Each device has its own channel and queue: a job that holds device A's only
    channel does not delay an execution on device B."""
    with NpuManager.connect(runtime_dir) as mgr:
        on_a, on_b = Answers(), Answers()
        mgr.request_can_load_model(ModelLoadRequest(1, device=A), on_a)
        mgr.request_can_load_model(ModelLoadRequest(2, device=B), on_b)
        on_a.wait(LoadStatus.CAN_LOAD_NOW)
        on_b.wait(LoadStatus.CAN_LOAD_NOW)
        x = np.zeros((1, 4), np.float32)
        with nn.device(A, runtime_dir) as dev_a, nn.device(B, runtime_dir) as dev_b:
            long_job = dev_a.prepare_model(add_model(), grant=on_a.listener)
            quick = dev_b.prepare_model(add_model(), grant=on_b.listener)
            ended: list[str] = []

            def hog() -> None:
                try:
                    long_job.execute({"x": x}, steps=1_000_000, feedback={"y": "x"})
                    ended.append("completed")
                except NpuError as exc:
                    ended.append(type(exc).__name__)

            t = threading.Thread(target=hog)
            t.start()
            try:
                _wait(lambda: _stats(runtime_dir, A)["busy"] == 1, "A's channel taken")
                assert _stats(runtime_dir, B)["busy"] == 0
                for _ in range(20):
                    np.testing.assert_array_equal(quick.execute({"x": x})["y"], x + 1)
                assert _stats(runtime_dir, A)["busy"] == 1 and not ended, \
                    "the long job went on meanwhile"
            finally:
                long_job.cancel()
                t.join(30)
            assert ended == ["WorkCancelled"], ended


def test_the_host_restarts_for_both_devices(npud: DaemonProcess, runtime_dir: Path) -> None:
    """The host process dies: both its devices go down and come back with the one new
    process npud starts (the first device's slot restarts it; the other attaches)."""
    [(old_pid, _argv)] = _driver_hosts(npud.pid)
    os.kill(old_pid, signal.SIGKILL)
    with NpuManager.connect(runtime_dir) as mgr:
        def both_up_again() -> bool:
            devs = {d["name"]: d for d in mgr.dump()["devices"]}
            new = [pid for pid, _ in _driver_hosts(npud.pid)]
            return new not in ([], [old_pid]) and all(devs[n]["available"] for n in (A, B))

        _wait(both_up_again, "both devices up again under a new host")
        assert len(_driver_hosts(npud.pid)) == 1
        on_b = Answers()
        mgr.request_can_load_model(ModelLoadRequest(1, device=B), on_b)
        on_b.wait(LoadStatus.CAN_LOAD_NOW)
        x = np.zeros((1, 4), np.float32)
        with nn.device(B, runtime_dir) as dev_b:
            model = dev_b.prepare_model(add_model(), grant=on_b.listener)
            np.testing.assert_array_equal(model.execute({"x": x})["y"], x + 1)
            model.release()


def test_a_restarted_npud_adopts_the_host_and_both_devices_grants(
        runtime_dir: Path, state_dir: Path) -> None:
    """npud SIGKILLed: the host keeps serving both devices' models; a new npud adopts
    the host (its first device's slot) and attaches to the other device's socket; both
    grants are adopted as loaded, and the one host process still serves both."""
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    cfg = {"manager": {"adopt_grace_s": 5.0},
           "driver": [{"name": "ref", "plugin": "reference", "channels": 1,
                       "options": {"devices": ["a", "b"]}}]}
    first = DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60).start()
    second: DaemonProcess | None = None
    x = np.zeros((1, 4), np.float32)
    try:
        [(host_pid, _argv)] = _driver_hosts(first.pid)
        with NpuManager.connect(runtime_dir) as mgr, nn.device(A, runtime_dir) as dev_a, \
                nn.device(B, runtime_dir) as dev_b:
            models = []
            for rid, (name, dev) in enumerate(((A, dev_a), (B, dev_b)), 1):
                ans = Answers()
                req = ModelLoadRequest(rid, device=name)
                mgr.request_can_load_model(req, ans)
                ans.wait(LoadStatus.CAN_LOAD_NOW)
                models.append(dev.prepare_model(add_model(), grant=ans.listener))
                ans.listener.notify_model_loaded(req)
            first.signal(signal.SIGKILL)
            assert first.proc is not None
            first.proc.wait(10)
            for m in models:  # orphaned, the host keeps running what it loaded
                np.testing.assert_array_equal(m.execute({"x": x})["y"], x + 1)
            second = DaemonProcess(runtime_dir, cfg, drivers=True, env=env,
                                   ready_timeout=60).start()

            def adopted() -> bool:
                try:
                    reqs = mgr.dump()["requests"]
                except ServiceUnavailable:  # the SDK is still reconnecting
                    return False
                return sorted((r["request_id"], r["state"]) for r in reqs) == [
                    (1, "loaded"), (2, "loaded")]

            _wait(adopted, "both devices' requests adopted as loaded")
            devs = {d["name"]: d["available"] for d in mgr.dump()["devices"]}
            assert devs == {A: True, B: True}
            for m in models:
                np.testing.assert_array_equal(m.execute({"x": x})["y"], x + 1)
                m.release()
    finally:
        if second is not None:
            second.stop()
        if first.proc is not None and first.proc.poll() is None:
            first.proc.kill()
        first._cleanup()
    assert second is not None
    assert f"driver {A} adopted (pid {host_pid}" in second.output, second.output
    assert f"driver {B} is up (pid {host_pid}" in second.output, second.output
