"""A prepare whose driver host dies while it compiles: the client gets DeviceUnavailable
from the closed connection, not the call timeout (a real host process, SIGKILLed).

A guard beside the restart conformance check: what looked like a prepare left without
an answer after a driver restart was a live host compiling at SCHED_IDLE (see
tests/drivers/test_conformance_table_push.py); a dead one must never look like that.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from npumanager.errors import DeviceUnavailable
from npumanager.nn.device import Device
from npumanager.testing.driver_host import DriverProcess, running_driver

pytestmark = pytest.mark.slow

FAKE = "npumanager.testing.fake_driver:FakeDriver"


@pytest.fixture
def host(runtime_dir: Path, state_dir: Path, tmp_path: Path) -> Iterator[DriverProcess]:
    cfg = tmp_path / "npu.toml"
    cfg.write_text(f'[manager]\nenforce_admission = false\n'
                   f'[[driver]]\nname = "fake"\nplugin = "{FAKE}"\nchannels = 1\n')
    with running_driver("fake", runtime_dir, state_dir, config=cfg) as dp:
        yield dp


def _threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def test_a_prepare_whose_host_dies_mid_compile_gets_device_unavailable(
        host: DriverProcess, runtime_dir: Path) -> None:
    pid = host.proc.pid
    outcome: list[BaseException | None] = []
    with Device("fake", runtime_dir) as dev:
        dev.get_number_of_cache_files_needed()  # connected: the prepare goes out at once
        before = _threads(pid)

        def prepare() -> None:
            try:
                dev.prepare_model(json.dumps({"compile_ms": 600_000}).encode())
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        th = threading.Thread(target=prepare, daemon=True)
        th.start()
        # The host's compile pool starts its first thread for this prepare (it then
        # compiles for 10 minutes). Whenever the kill lands, the outcome is the same.
        reached = threading.Event()
        for _ in range(200):
            if _threads(pid) > before:
                reached.set()
                break
            reached.wait(0.05)
        os.kill(pid, signal.SIGKILL)
        th.join(120)  # far below the call timeout (300 s): a hang shows up here
        assert not th.is_alive(), "the prepare still waits on a dead host"
    (exc,) = outcome
    assert isinstance(exc, DeviceUnavailable), exc
    assert "did not answer" not in str(exc), f"timed out rather than saw the close: {exc}"
