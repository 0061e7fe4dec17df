"""Bursts (``model.burst()``) through a real driver host subprocess: the same outputs as
plain executions, and the driver's scheduling deciding for them exactly as for plain
ones — revocation, preemption between steps, thermal hold-back, debouncing, cancel."""

from __future__ import annotations

import json
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import nn
from npumanager.constants import ThermalStatus
from npumanager.errors import (
    DeviceUnavailable,
    GrantRevoked,
    InvalidArgument,
    WorkCancelled,
)
from npumanager.hal.wire import SERVICE
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.testing.driver_host import running_driver
from npumanager.testing.onnx_models import add_model, relu_model
from npumanager.wire.client import SyncRpcClient

pytestmark = pytest.mark.slow

FAKE = "npumanager.testing.fake_driver:FakeDriver"
X = {"x": np.zeros((1, 4), np.float32)}
_KINDS = {"hal.on_work_requested": "requested", "hal.on_work_started": "started",
          "hal.on_work_ended": "ended"}


def script(**kw: object) -> bytes:
    return json.dumps(kw).encode()


@pytest.fixture
def fake(runtime_dir: Path, state_dir: Path, tmp_path: Path) -> Iterator[Path]:
    cfg = tmp_path / "npu.toml"
    cfg.write_text(f'[[driver]]\nname = "fake"\nplugin = "{FAKE}"\nchannels = 1\n')
    with running_driver("fake", runtime_dir, state_dir, config=cfg):
        yield runtime_dir


@pytest.fixture
def reference(runtime_dir: Path, state_dir: Path) -> Iterator[Path]:
    with running_driver("reference", runtime_dir, state_dir, args=["--no-enforce-admission"]):
        yield runtime_dir


class Hal:
    """Plays npud on the HAL socket: grants, thermal status, and every work event (the
    test waits for a pushed event, never for a stretch of time)."""

    def __init__(self, rt: Path, debounce_ms: int = 0) -> None:
        self.events: list[tuple[str, int, int, int]] = []  # (kind, work id, eff, reason)
        self._cond = threading.Condition()
        self.rpc = SyncRpcClient(str(rt / "drivers" / "fake.sock"), SERVICE, on_push=self._push)
        self.rpc.call("hal.attach_manager", pb.AttachManager(enforce_admission=True))
        self.rpc.call("hal.set_callback", pb.SetCallback(debounce_ms=debounce_ms))

    def _push(self, method: str, payload: bytes, fds: list[int]) -> None:
        kind = _KINDS.get(method)
        if kind is None:
            return
        m = pb.WorkEvent.FromString(payload)
        with self._cond:
            self.events.append((kind, m.info.id, m.info.effective_priority, m.reason))
            self._cond.notify_all()

    def wait_for(self, what: Callable[[], object], timeout: float = 30.0) -> None:
        with self._cond:
            assert self._cond.wait_for(what, timeout), f"never got there: {self.events}"

    def of(self, kind: str, reason: int | None = None) -> list[int]:
        with self._cond:
            return [w for k, w, _, r in self.events
                    if k == kind and (reason is None or r == reason)]

    def grant(self) -> str:
        gid = secrets.token_hex(16)
        self.rpc.call("hal.grant_issued", pb.GrantIssued(uid=os.getuid(), request_id=1,
                                                         grant_id=gid))
        return gid

    def revoke(self, gid: str) -> None:
        self.rpc.call("hal.grant_ended", pb.GrantEnded(grant_id=gid, revoked=True))

    def thermal(self, status: ThermalStatus) -> None:
        self.rpc.call("hal.set_thermal_status", pb.ThermalStatusMsg(status=int(status)))

    def close(self) -> None:
        self.rpc.close()


@pytest.fixture
def hal(fake: Path) -> Iterator[Hal]:
    h = Hal(fake)
    try:
        yield h
    finally:
        h.close()


@pytest.fixture
def dev(fake: Path) -> Iterator[nn.Device]:
    d = nn.device("fake", fake)
    try:
        yield d
    finally:
        d.close()


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` on a thread; the list gets its result or its exception."""
    got: list[Any] = []

    def run() -> None:
        try:
            got.append(fn())
        except BaseException as exc:
            got.append(exc)

    th = threading.Thread(target=run)
    th.start()
    return th, got


# --- outputs -------------------------------------------------------------------------


def test_burst_outputs_match_plain_executions(reference: Path) -> None:
    dev = nn.device("reference", reference)
    try:
        small = dev.prepare_model(add_model(4))
        big = dev.prepare_model(relu_model((512, 1024)))  # 2 MiB: through the data area
        xb = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
        with small.burst() as b, big.burst() as bb:
            for i in range(5):
                x = np.full((1, 4), i, np.float32)
                np.testing.assert_array_equal(b.execute({"x": x})["y"], small.execute(
                    {"x": x})["y"])
                np.testing.assert_array_equal(bb.execute({"x": xb + i})["y"],
                                              np.maximum(xb + i, 0))
            view = bb.execute({"x": xb}, copy_outputs=False)["y"]
            np.testing.assert_array_equal(view, np.maximum(xb, 0))
            del view
        with pytest.raises(InvalidArgument):
            b.execute({"x": np.zeros((1, 4), np.float32)})  # closed
        small.release()
        big.release()
    finally:
        dev.close()


def test_inputs_in_the_models_input_buffers_are_not_copied(
        reference: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dev = nn.device("reference", reference)
    try:
        big = dev.prepare_model(relu_model((512, 1024)))  # 2 MiB in
        bufs = big.input_buffers()
        copied: list[int] = []
        real = np.copyto

        def copyto(dst: Any, src: Any, *a: Any, **kw: Any) -> None:
            copied.append(np.asarray(src).nbytes)
            real(dst, src, *a, **kw)

        with big.burst() as b:
            for i in range(3):
                bufs["x"][...] = np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024) - i
                monkeypatch.setattr(np, "copyto", copyto)
                y = b.execute(bufs)["y"]
                monkeypatch.undo()
                np.testing.assert_array_equal(y, np.maximum(bufs["x"], 0))
                assert copied == [], "the input was named where it lies, not copied"
            # An array of its own is copied into the burst's memory as before.
            x = np.ones((512, 1024), np.float32)
            np.testing.assert_array_equal(b.execute({"x": x})["y"], x)
        big.release()
    finally:
        dev.close()


def test_burst_grows_for_outputs_larger_than_guessed(hal: Hal, dev: nn.Device) -> None:
    model = dev.prepare_model(script(), grant=hal.grant())  # dynamic shapes: sized by guess
    with model.burst() as b:
        first = repr(b)
        x = np.arange(1 << 20, dtype=np.float32).reshape(1024, 1024)  # 4 MiB in and out
        np.testing.assert_array_equal(b.execute({"x": x})["y"], x + 1)
        assert repr(b) != first, "the burst's memory grew"
        np.testing.assert_array_equal(b.execute(X)["y"], X["x"] + 1)


def test_multi_step_burst_feeds_back(hal: Hal, dev: nn.Device) -> None:
    model = dev.prepare_model(script(), grant=hal.grant())
    with model.burst() as b:
        np.testing.assert_array_equal(b.execute(X, steps=7, feedback={"y": "x"})["y"],
                                      X["x"] + 7)


def test_release_closes_the_models_bursts(hal: Hal, dev: nn.Device) -> None:
    model = dev.prepare_model(script(), grant=hal.grant())
    b = model.burst()
    b.execute(X)
    model.release()
    assert b.closed
    with pytest.raises(InvalidArgument):
        b.execute(X)


# --- the driver's scheduling decides ------------------------------------------------


def test_revoked_model_burst_execute_raises_grant_revoked(hal: Hal, dev: nn.Device) -> None:
    gid = hal.grant()
    model = dev.prepare_model(script(latency_ms=20), grant=gid)
    with model.burst() as b:
        b.execute(X)
        # Its end reported: the next one is not part of the same debouncing burst.
        hal.wait_for(lambda: hal.of("ended"))
        th, got = in_thread(lambda: b.execute(X, steps=500, feedback={"y": "x"}))
        hal.wait_for(lambda: len(hal.of("started")) >= 2)  # the long one runs
        hal.revoke(gid)
        th.join(30)
        assert len(got) == 1 and isinstance(got[0], GrantRevoked), got
        with pytest.raises(GrantRevoked):
            b.execute(X)  # and every later one says why


def test_more_important_plain_work_preempts_a_burst_between_steps(
        hal: Hal, dev: nn.Device) -> None:
    gid = hal.grant()
    background = dev.prepare_model(script(latency_ms=10), grant=gid)
    foreground = dev.prepare_model(script(latency_ms=1), grant=gid)
    with background.burst() as b:
        th, got = in_thread(lambda: b.execute(X, job_priority=900, steps=10_000,
                                              feedback={"y": "x"}))
        hal.wait_for(lambda: hal.of("started"))
        (burst_work,) = hal.of("started")
        out = foreground.execute(X, job_priority=0)  # one channel: it must preempt
        np.testing.assert_array_equal(out["y"], X["x"] + 1)
        hal.wait_for(lambda: burst_work in hal.of("ended", reason=2))  # EndReason.PAUSED
        hal.wait_for(lambda: burst_work in hal.of("started", reason=1))  # RESUMED
        background.cancel()
        th.join(30)
        assert len(got) == 1 and isinstance(got[0], WorkCancelled), got


def test_a_more_important_burst_preempts_plain_background_work(
        hal: Hal, dev: nn.Device) -> None:
    gid = hal.grant()
    background = dev.prepare_model(script(latency_ms=10), grant=gid)
    foreground = dev.prepare_model(script(latency_ms=1), grant=gid)
    th, got = in_thread(lambda: background.execute(X, job_priority=900, steps=10_000,
                                                   feedback={"y": "x"}))
    hal.wait_for(lambda: hal.of("started"))
    (plain_work,) = hal.of("started")
    with foreground.burst() as b:
        for _ in range(3):
            np.testing.assert_array_equal(b.execute(X)["y"], X["x"] + 1)
    hal.wait_for(lambda: plain_work in hal.of("ended", reason=2))  # PAUSED for the burst
    hal.wait_for(lambda: plain_work in hal.of("started", reason=1))  # RESUMED after
    background.cancel()
    th.join(30)
    assert len(got) == 1 and isinstance(got[0], WorkCancelled), got


def test_thermal_hold_back_keeps_a_burst_execution_queued(hal: Hal, dev: nn.Device) -> None:
    model = dev.prepare_model(script(), grant=hal.grant())
    with model.burst() as b:
        b.execute(X)
        hal.wait_for(lambda: hal.of("ended"))  # (else the next continues its debouncing)
        hal.thermal(ThermalStatus.CRITICAL)  # an unknown uid's work (eff >= 1000) waits
        before = len(hal.of("requested"))
        th, got = in_thread(lambda: b.execute(X))
        hal.wait_for(lambda: len(hal.of("requested")) > before)
        (work,) = hal.of("requested")[before:]
        assert work not in hal.of("started") and th.is_alive(), "held back"
        hal.thermal(ThermalStatus.NONE)
        th.join(30)
        np.testing.assert_array_equal(got[0]["y"], X["x"] + 1)
        assert work in hal.of("started")


def test_burst_executions_are_debounced_like_plain_ones(fake: Path, dev: nn.Device) -> None:
    h = Hal(fake, debounce_ms=60_000)  # every execution below falls in one window
    try:
        model = dev.prepare_model(script(), grant=h.grant())
        with model.burst() as b:
            for _ in range(5):
                b.execute(X)
        model.execute(X)
        h.wait_for(lambda: h.of("started"))
        assert len(h.of("requested")) == 1 and len(h.of("started")) == 1, h.events
        assert h.of("ended") == [], "the window is still open"
    finally:
        h.close()


def test_cancel_ends_a_running_burst_execution(hal: Hal, dev: nn.Device) -> None:
    model = dev.prepare_model(script(latency_ms=20), grant=hal.grant())
    with model.burst() as b:
        th, got = in_thread(lambda: b.execute(X, steps=500, feedback={"y": "x"}))
        hal.wait_for(lambda: hal.of("started"))
        model.cancel()
        th.join(30)
        assert len(got) == 1 and isinstance(got[0], WorkCancelled), got
        np.testing.assert_array_equal(b.execute(X)["y"], X["x"] + 1)  # still serving


def test_a_dead_driver_is_device_unavailable_not_a_hang(
        runtime_dir: Path, state_dir: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "npu.toml"
    cfg.write_text(f'[[driver]]\nname = "fake"\nplugin = "{FAKE}"\nchannels = 1\n')
    with running_driver("fake", runtime_dir, state_dir, config=cfg,
                        args=["--no-enforce-admission"]) as drv:
        dev = nn.device("fake", runtime_dir)
        model = dev.prepare_model(script(latency_ms=2000))
        b = model.burst()
        th, got = in_thread(lambda: b.execute(X))
        drv.proc.kill()
        th.join(30)
        assert len(got) == 1 and isinstance(got[0], DeviceUnavailable), got
        dev.close()


def test_a_burst_execution_the_driver_never_answers_times_out(hal: Hal, dev: nn.Device) -> None:
    """The client blocks in the ring's recv with a receive timeout: an answer that never
    comes within the connection's call timeout is DeviceUnavailable, and the burst closes
    (its channel cannot be trusted to answer that request's number any more)."""
    model = dev.prepare_model(script(latency_ms=20_000), grant=hal.grant())
    model._rpc.call_timeout = 0.3  # (read when the burst opens)
    b = model.burst()
    with pytest.raises(DeviceUnavailable, match="did not answer a burst execution"):
        b.execute(X)
    assert b.closed
    with pytest.raises(InvalidArgument, match="closed"):
        b.execute(X)
    model.cancel()
