"""Fixtures for end-to-end tests: a real `npu serve` subprocess and an admin client."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from npumanager import NpuManager
from npumanager.testing.daemon import DaemonProcess

if os.getuid() != 0:
    pytest.skip("multi-uid integration tests need root (setuid in forked apps)",
                allow_module_level=True)

#: Distinct uids for the client apps (no such users need to exist).
FG, BG, THIRD = 50001, 50002, 50003

BASE_CONFIG: dict[str, Any] = {"manager": {"log_level": "info", "unload_deadline_s": 5.0}}

StartDaemon = Callable[..., DaemonProcess]


@pytest.fixture
def start_npud(runtime_dir: Path) -> Iterator[StartDaemon]:
    started: list[DaemonProcess] = []

    def start(manager: dict[str, Any] | None = None, **sections: Any) -> DaemonProcess:
        cfg: dict[str, Any] = {"manager": {**BASE_CONFIG["manager"], **(manager or {})},
                               **sections}
        d = DaemonProcess(runtime_dir, cfg).start()
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()


@pytest.fixture
def npud(start_npud: StartDaemon) -> DaemonProcess:
    return start_npud()


@pytest.fixture
def admin(npud: DaemonProcess, runtime_dir: Path) -> Iterator[NpuManager]:
    with NpuManager(runtime_dir) as m:
        yield m


def request_state(mgr: NpuManager, uid: int, rid: int) -> str | None:
    for r in mgr.dump()["requests"]:
        if r["uid"] == uid and r["request_id"] == rid:
            return str(r["state"])
    return None
