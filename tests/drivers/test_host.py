"""The driver host process: admission, revocation, memory reports, admin-only HAL,
cancellation and shared memory — through real sockets to a real subprocess."""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from npumanager import nn
from npumanager.errors import (
    GrantRequired,
    GrantRevoked,
    PermissionDenied,
    WorkCancelled,
)
from npumanager.hal import connect_scheduling
from npumanager.hal.wire import SERVICE
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.testing.driver_host import running_driver
from npumanager.testing.procs import run_as
from npumanager.wire.client import SyncRpcClient

pytestmark = pytest.mark.slow

FAKE = "npumanager.testing.fake_driver:FakeDriver"


@pytest.fixture
def fake(runtime_dir: Path, state_dir: Path, tmp_path: Path) -> Iterator[Path]:
    cfg = tmp_path / "npu.toml"
    cfg.write_text(f'[[driver]]\nname = "fake"\nplugin = "{FAKE}"\nchannels = 1\n'
                   'options = {temperature_c = 42.5}\n')
    with running_driver("fake", runtime_dir, state_dir, config=cfg):
        yield runtime_dir


class Manager:
    """Plays npud on the HAL socket: attach, grants, the HAL callback, model_memory pushes.
    Tests wait for a push (a state of the driver), never for a stretch of time."""

    def __init__(self, rt: Path) -> None:
        self.memory: list[tuple[str, int]] = []
        self.started: list[int] = []  # work ids, from on_work_started
        self._cond = threading.Condition()
        self.rpc = SyncRpcClient(str(rt / "drivers" / "fake.sock"), SERVICE,
                                 on_push=self._push)
        self.rpc.call("hal.attach_manager", pb.AttachManager(enforce_admission=True))
        self.rpc.call("hal.set_callback", pb.SetCallback(debounce_ms=0))

    def _push(self, method: str, payload: bytes, fds: list[int]) -> None:
        with self._cond:
            if method == "hal.model_memory":
                m = pb.ModelMemory.FromString(payload)
                self.memory.append((m.grant_id, m.nbytes))
            elif method == "hal.on_work_started":
                self.started.append(pb.WorkEvent.FromString(payload).info.id)
            self._cond.notify_all()

    def wait_for(self, what: Callable[[], object], timeout: float = 30.0) -> None:
        with self._cond:
            assert self._cond.wait_for(what, timeout), "the driver never got there"

    def grant(self, uid: int | None = None) -> str:
        gid = secrets.token_hex(16)
        self.rpc.call("hal.grant_issued", pb.GrantIssued(
            uid=os.getuid() if uid is None else uid, request_id=1, grant_id=gid))
        return gid

    def end(self, gid: str) -> None:
        self.rpc.call("hal.grant_ended", pb.GrantEnded(grant_id=gid, revoked=True))

    def close(self) -> None:
        self.rpc.close()


def script(**kw: object) -> bytes:
    return json.dumps(kw).encode()


X = {"x": np.zeros((1, 4), np.float32)}


def test_grant_binds_model_and_revocation_releases_it(fake: Path) -> None:
    mgr = Manager(fake)
    dev = nn.device("fake", fake)
    try:
        gid = mgr.grant()
        model = dev.prepare_model(script(memory_bytes=123456), grant=gid)
        np.testing.assert_array_equal(model.execute(X)["y"], X["x"] + 1)
        mgr.wait_for(lambda: mgr.memory)
        assert mgr.memory == [(gid, 123456)], "the driver reports the model's real memory"
        mgr.end(gid)
        with pytest.raises(GrantRevoked):
            model.execute(X)
        with pytest.raises(GrantRevoked):
            dev.prepare_model(script(), grant=gid)  # an ended grant admits nothing
    finally:
        dev.close()
        mgr.close()


def test_grant_of_another_uid_is_refused(fake: Path) -> None:
    mgr = Manager(fake)
    dev = nn.device("fake", fake)
    try:
        with pytest.raises(GrantRequired):
            dev.prepare_model(script(), grant=mgr.grant(uid=os.getuid() + 1))
    finally:
        dev.close()
        mgr.close()


def test_revocation_cancels_running_work_with_grant_revoked(fake: Path) -> None:
    mgr = Manager(fake)
    dev = nn.device("fake", fake)
    errors: list[BaseException] = []
    try:
        gid = mgr.grant()
        model = dev.prepare_model(script(latency_ms=20), grant=gid)

        def run() -> None:
            try:
                model.execute(X, steps=500, feedback={"y": "x"})
            except BaseException as exc:
                errors.append(exc)

        th = threading.Thread(target=run)
        th.start()
        mgr.wait_for(lambda: mgr.started)  # the job runs (its first step is on a channel)
        mgr.end(gid)
        th.join(10)
        assert len(errors) == 1 and isinstance(errors[0], GrantRevoked)
    finally:
        dev.close()
        mgr.close()


def test_cancel_from_client_ends_work(fake: Path) -> None:
    mgr = Manager(fake)
    dev = nn.device("fake", fake)
    errors: list[BaseException] = []
    try:
        model = dev.prepare_model(script(latency_ms=20), grant=mgr.grant())

        def run() -> None:
            try:
                model.execute(X, steps=500, feedback={"y": "x"})
            except BaseException as exc:
                errors.append(exc)

        th = threading.Thread(target=run)
        th.start()
        mgr.wait_for(lambda: mgr.started)
        model.cancel()
        th.join(10)
        assert len(errors) == 1 and isinstance(errors[0], WorkCancelled)
        assert model.execute(X)["y"].shape == (1, 4)  # the model still works
    finally:
        dev.close()
        mgr.close()


def test_multi_step_feedback_runs_every_step(fake: Path) -> None:
    mgr = Manager(fake)
    dev = nn.device("fake", fake)
    try:
        model = dev.prepare_model(script(), grant=mgr.grant())
        out = model.execute(X, steps=7, feedback={"y": "x"})
        np.testing.assert_array_equal(out["y"], X["x"] + 7)
    finally:
        dev.close()
        mgr.close()


def test_temperature_comes_from_the_driver(fake: Path) -> None:
    with connect_scheduling("fake", fake) as hal:
        assert hal.get_temperature() == 42.5


def _hal_as_other_uid(rt: str) -> str:
    rpc = SyncRpcClient(str(Path(rt) / "drivers" / "fake.sock"), SERVICE)
    try:
        rpc.call("hal.set_scheduling_configs", pb.SchedulingConfigs())
    except PermissionDenied as exc:
        return f"denied: {exc}"
    finally:
        rpc.close()
    return "allowed"


def _device_as_other_uid(rt: str) -> str:
    rpc = SyncRpcClient(str(Path(rt) / "drivers" / "fake.sock"), SERVICE)
    try:
        payload, _ = rpc.call("device.capabilities", Empty())
        return pb.Capabilities.FromString(payload).name
    finally:
        rpc.close()


def test_hal_is_admin_only_device_is_for_everyone(fake: Path) -> None:
    assert run_as(65534, 65534, _hal_as_other_uid, str(fake)).startswith("denied")
    assert run_as(65534, 65534, _device_as_other_uid, str(fake)) == "fake"
