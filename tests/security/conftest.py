"""Fixtures for the adversarial tests: a real npud (and driver host) as root, apps under
real uids. Every test here plays a hostile local user against root's npud and checks two
things: the attack fails, and another user's app is still served. Those modules skip
without root (``harness.needs_root``); the frame-decoder fuzzing needs no root."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from npumanager.testing.daemon import DaemonProcess

StartDaemon = Callable[..., DaemonProcess]

# The apps' uids are unknown to npud, so their work is BACKGROUND, which the default
# background_sched ("idle") runs at SCHED_IDLE. On a machine kept busy (CI runs the suite
# on both cores) a SCHED_IDLE thread can wait tens of seconds for a core: stop 19's CI
# failed on a flooder whose burst threads never got to drain its doorbell in 60 s. These
# tests are about bounds, typed errors and who is served, not CPU classes (tests/drivers
# covers those), so the default driver here runs background work at normal priority.
DRIVER = [{"name": "reference", "plugin": "reference", "background_sched": "normal"}]


@pytest.fixture
def start_npud(runtime_dir: Path, state_dir: Path) -> Iterator[StartDaemon]:
    """``start_npud(manager={...}, drivers=False, **sections)``: a real `npu serve`."""
    started: list[DaemonProcess] = []

    def start(manager: dict[str, Any] | None = None, *, drivers: bool = False,
              rt: Path | None = None, **sections: Any) -> DaemonProcess:
        cfg: dict[str, Any] = {"manager": {"log_level": "info", **(manager or {})}, **sections}
        if drivers and "driver" not in sections:
            cfg["driver"] = DRIVER
        env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
        d = DaemonProcess(rt or runtime_dir, cfg, drivers=drivers, env=env,
                          ready_timeout=60).start()
        started.append(d)
        return d

    yield start
    for d in started:
        d.stop()
