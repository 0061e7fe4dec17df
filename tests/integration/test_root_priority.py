"""npud ranks root's requests as foreground; its drivers must run root's work the same way
(before, root was an unconfigured uid to them: priority 1000, the BACKGROUND class). An
admin reads its own place in a driver's table from device.stats ("caller")."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from npumanager import NpuManager
from npumanager.hal.wire import SERVICE
from npumanager.paths import driver_socket
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.testing.daemon import DaemonProcess, driver_hosts
from npumanager.wire.client import SyncRpcClient

pytestmark = pytest.mark.slow


@pytest.fixture
def npud(runtime_dir: Path, state_dir: Path) -> Iterator[DaemonProcess]:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    with DaemonProcess(runtime_dir, drivers=True, env=env, ready_timeout=60) as d:
        yield d


def caller_entry(runtime_dir: str) -> dict[str, Any]:
    rpc = SyncRpcClient(str(driver_socket("reference", runtime_dir)), SERVICE)
    try:
        payload, _ = rpc.call("device.stats", Empty())
    finally:
        rpc.close()
    return dict(json.loads(payload)["caller"])


@pytest.mark.skipif(os.geteuid() != 0, reason="root's entry is what is tested")
def test_root_runs_foreground_in_the_driver(npud: DaemonProcess, runtime_dir: Path) -> None:
    assert caller_entry(str(runtime_dir)) == {
        "uid": 0, "app_priority": 100, "class": "foreground"}
    # A restarted driver host gets npud's table, root's entry in it, at its attach.
    [old] = driver_hosts(runtime_dir)
    os.kill(old, signal.SIGKILL)
    deadline = time.monotonic() + 30
    with NpuManager.connect(runtime_dir) as mgr:
        while not (driver_hosts(runtime_dir) not in ([], [old]) and all(
                d["available"] for d in mgr.dump()["devices"])):
            assert time.monotonic() < deadline, "the driver host did not come back"
            time.sleep(0.05)
    assert caller_entry(str(runtime_dir))["app_priority"] == 100
