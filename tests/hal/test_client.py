"""The IScheduling client: typed callbacks, validation before sending, admin only."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from npumanager import nn
from npumanager.errors import IllegalArgument, PermissionDenied, ServiceUnavailable
from npumanager.hal import (
    EndReason,
    ISchedulingCallback,
    SchedulingConfig,
    StartReason,
    WorkInfo,
    connect_scheduling,
)
from npumanager.testing.driver_host import running_driver
from npumanager.testing.procs import run_as


def test_connecting_to_a_missing_driver_is_service_unavailable(runtime_dir: Path) -> None:
    with pytest.raises(ServiceUnavailable):
        connect_scheduling("nothing", runtime_dir)


@pytest.fixture
def fake(runtime_dir: Path, state_dir: Path, tmp_path: Path) -> Iterator[Path]:
    cfg = tmp_path / "npu.toml"
    cfg.write_text('[[driver]]\nname = "fake"\n'
                   'plugin = "npumanager.testing.fake_driver:FakeDriver"\n')
    with running_driver("fake", runtime_dir, state_dir, config=cfg,
                        args=["--no-enforce-admission"]):
        yield runtime_dir


class Recorder(ISchedulingCallback):
    def __init__(self) -> None:
        self.calls: list[tuple[str, WorkInfo, object]] = []
        self.done = threading.Event()

    def on_work_requested(self, info: WorkInfo) -> None:
        self.calls.append(("requested", info, None))

    def on_work_started(self, info: WorkInfo, reason: StartReason) -> None:
        self.calls.append(("started", info, reason))

    def on_work_ended(self, info: WorkInfo, reason: EndReason) -> None:
        self.calls.append(("ended", info, reason))
        self.done.set()


@pytest.mark.slow
def test_callbacks_arrive_typed(fake: Path) -> None:
    rec = Recorder()
    with connect_scheduling("fake", fake) as hal, nn.device("fake", fake) as dev:
        hal.set_scheduling_configs([SchedulingConfig(uid=0, app_priority=300)])
        hal.set_callback(rec, debounce_duration_ms=0)
        model = dev.prepare_model(json.dumps({}).encode())
        model.execute({"x": np.zeros((1, 2), np.float32)}, job_priority=3)
        assert rec.done.wait(5)
    kinds = [(k, r) for k, _, r in rec.calls]
    assert kinds == [("requested", None), ("started", StartReason.INITIAL),
                     ("ended", EndReason.COMPLETED)]
    assert isinstance(rec.calls[1][2], StartReason)
    assert rec.calls[0][1].effective_priority == 303


@pytest.mark.slow
def test_invalid_configs_raise_before_anything_is_sent(fake: Path) -> None:
    with connect_scheduling("fake", fake) as hal:
        with pytest.raises(IllegalArgument):
            hal.set_scheduling_configs([SchedulingConfig(uid=1, app_priority=2000)])
        with pytest.raises(IllegalArgument):
            hal.update_scheduling_configs([SchedulingConfig(uid=1, app_priority=1),
                                           SchedulingConfig(uid=1, app_priority=2)])


def _connect_as_other(rt: str) -> str:
    try:
        connect_scheduling("fake", rt)
    except PermissionDenied as exc:
        return str(exc)
    return "connected"


@pytest.mark.slow
def test_non_admin_cannot_connect_scheduling(fake: Path) -> None:
    assert "admins only" in run_as(65534, 65534, _connect_as_other, str(fake))
