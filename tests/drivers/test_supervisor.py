"""npud's driver supervisor with real driver processes: spawn, table push, event
forwarding, death noticed at once, restart with back-off, grants re-sent."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import signal
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import nn
from npumanager.clock import MonotonicClock
from npumanager.config import Config
from npumanager.errors import DeviceUnavailable, DirectAccessDenied
from npumanager.hal.types import EndReason, SchedulingConfig, WorkInfo
from npumanager.proto.v1.common_pb2 import DeviceInfo
from npumanager.service.supervisor import Backoff, DriverSupervisor
from npumanager.testing.daemon import process_running
from tests.drivers.supervisor_thread import supervisor_on_a_thread

FAKE = "npumanager.testing.fake_driver:FakeDriver"
X = {"x": np.zeros((1, 4), np.float32)}


def test_backoff_doubles_up_to_the_maximum_and_resets_after_a_stable_run() -> None:
    b = Backoff(first=0.2, maximum=1.0, stable_s=10.0)
    assert [b.next_delay(0.1) for _ in range(5)] == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert b.next_delay(60.0) == 0.2


class Events:
    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self.cond = threading.Condition()

    def _add(self, kind: str, value: Any) -> None:
        with self.cond:
            self.log.append((kind, value))
            self.cond.notify_all()

    def driver_up(self, info: DeviceInfo) -> None:
        self._add("up", info)

    def driver_down(self, name: str, reason: str) -> None:
        self._add("down", reason)

    def work_ended(self, driver: str, info: WorkInfo, reason: EndReason) -> None:
        self._add("ended", (info, reason))

    def model_memory(self, driver: str, grant_id: str, nbytes: int) -> None:
        self._add("memory", (grant_id, nbytes))

    def grant_end_applied(self, driver: str, grant_id: str) -> None:
        pass

    def work_started(self, driver: str, info: WorkInfo) -> None:
        self._add("started", info)

    def wait(self, kind: str, n: int = 1, timeout: float = 30.0) -> list[Any]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while sum(k == kind for k, _ in self.log) < n:
                left = deadline - time.monotonic()
                assert left > 0, f"no {n}x {kind}: {self.log}"
                self.cond.wait(left)
            return [v for k, v in self.log if k == kind]


class Running:
    def __init__(self, sup: DriverSupervisor, loop: asyncio.AbstractEventLoop,
                 events: Events) -> None:
        self.sup, self.loop, self.events = sup, loop, events

    def do(self, fn: Callable[..., Any], *args: Any) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the supervisor's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def applied(self) -> None:
        """Every push so far has reached the driver (a round trip on its connection)."""
        self.run(self.sup.wait_applied())

    def driver_pid(self) -> int:
        proc = self.sup.slots[0].proc
        assert proc is not None
        return proc.pid


@contextlib.contextmanager
def start_supervisor(runtime_dir: Path, state_dir: Path) -> Iterator[Running]:
    cfg = Config.load(overrides={
        "driver": [{"name": "fake", "plugin": FAKE, "channels": 1, "restart_backoff_s": 0.05,
                    "options": {"temperature_c": 51.0}}],
        "thermal": {"poll_interval_s": 0.05},
    })
    events = Events()
    sup = DriverSupervisor(cfg, runtime_dir, events, MonotonicClock(), state_dir=state_dir)
    with supervisor_on_a_thread(sup) as loop:
        yield Running(sup, loop, events)


@pytest.fixture
def supervised(runtime_dir: Path, state_dir: Path) -> Iterator[Running]:
    with start_supervisor(runtime_dir, state_dir) as running:
        yield running


@pytest.mark.slow
def test_detach_leaves_the_host_running_for_the_next_supervisor_to_adopt(
        supervised: Running, runtime_dir: Path, state_dir: Path) -> None:
    """npud's SIGTERM: the host is neither stopped nor reported down, its socket stays;
    the next npud's supervisor attaches to it (the pid it adopts is the host's, the one
    it signals at its own final stop) instead of starting one."""
    supervised.events.wait("up")
    pid = supervised.driver_pid()
    supervised.run(supervised.sup.detach())
    assert process_running(pid)
    assert (runtime_dir / "drivers" / "fake.sock").exists()
    assert [k for k, _ in supervised.events.log if k == "down"] == []
    with start_supervisor(runtime_dir, state_dir) as second:
        second.events.wait("up")
        slot = second.sup.slots[0]
        assert (slot.adopted_pid, slot.starts, slot.proc) == (pid, 0, None)
    # The second one's final stop stopped the host it adopted.
    deadline = time.monotonic() + 30
    while process_running(pid):
        assert time.monotonic() < deadline, "the adopted host was not stopped"
        time.sleep(0.05)


@pytest.mark.slow
def test_driver_comes_up_and_is_listed(supervised: Running) -> None:
    info = supervised.events.wait("up")[0]
    assert info.name == "fake" and info.available and info.channels == 1
    assert [d.name for d in supervised.sup.devices()] == ["fake"]
    supervised.run(supervised.sup.poll_temperatures())
    assert supervised.sup.temperatures() == {"fake": 51.0}


@pytest.mark.slow
def test_table_grants_and_events_flow_through(supervised: Running, runtime_dir: Path) -> None:
    supervised.events.wait("up")
    gid = secrets.token_hex(16)
    supervised.do(supervised.sup.grant_issued, os.getuid(), 7, gid)
    dev = nn.device("fake", runtime_dir)
    try:
        model = dev.prepare_model(b'{"memory_bytes": 4096}', grant=gid)
        assert supervised.events.wait("memory") == [(gid, 4096)]
        model.execute(X)
        info, reason = supervised.events.wait("ended")[0]
        assert reason == EndReason.COMPLETED and info.uid == os.getuid()
        supervised.do(supervised.sup.set_scheduling_configs,
                      [SchedulingConfig(uid=os.getuid(), app_priority=1,
                                        has_direct_access=False)])
        supervised.applied()
        with pytest.raises(DirectAccessDenied):
            model.execute(X)
    finally:
        dev.close()


@pytest.mark.slow
def test_killed_driver_mid_run_is_restarted_and_state_pushed_again(
        supervised: Running, runtime_dir: Path) -> None:
    supervised.events.wait("up")
    gid = secrets.token_hex(16)
    supervised.do(supervised.sup.grant_issued, os.getuid(), 1, gid)
    supervised.do(supervised.sup.set_scheduling_configs,
                  [SchedulingConfig(uid=os.getuid(), app_priority=100, max_priority=10)])
    dev = nn.device("fake", runtime_dir)
    errors: list[BaseException] = []
    try:
        model = dev.prepare_model(b'{"latency_ms": 20}', grant=gid)

        def run() -> None:
            try:
                model.execute(X, steps=1000, feedback={"y": "x"})
            except BaseException as exc:
                errors.append(exc)

        th = threading.Thread(target=run)
        th.start()
        supervised.events.wait("started")  # the decode loop runs in the driver
        first_pid = supervised.driver_pid()
        os.kill(first_pid, signal.SIGKILL)
        th.join(10)
        assert not th.is_alive(), "the client hung on a dead driver"
        assert len(errors) == 1 and isinstance(errors[0], DeviceUnavailable)
        assert "exited with code -9" in supervised.events.wait("down")[0]
        supervised.events.wait("up", 2)
        assert supervised.driver_pid() != first_pid
        # The live grant was re-sent: re-preparing with it works on the new driver.
        model = dev.prepare_model(b"{}", grant=gid)
        np.testing.assert_array_equal(model.execute(X)["y"], X["x"] + 1)
        info, _ = supervised.events.wait("ended")[-1]
        assert info.effective_priority == 100, "the table (max_priority 10) was pushed again"
    finally:
        dev.close()


@pytest.mark.slow
def test_refused_plugin_never_comes_up_and_npud_start_does_not_hang(
        runtime_dir: Path, state_dir: Path) -> None:
    cfg = Config.load(overrides={"driver": [{
        "name": "old", "plugin": "npumanager.testing.fake_driver:OldHalDriver",
        "restart_backoff_s": 0.05}]})
    events = Events()

    async def main() -> None:
        sup = DriverSupervisor(cfg, runtime_dir, events, MonotonicClock(), state_dir=state_dir,
                               startup_wait_s=30)
        t0 = time.monotonic()
        await sup.start()
        assert time.monotonic() - t0 < 30
        assert sup.devices()[0].available is False
        await sup.stop()

    asyncio.run(main())
    assert not [k for k, _ in events.log if k == "up"]


class LaneFirst(DriverSupervisor):
    """Each main host's start waits, before its handshake, until its background lane's
    has ended: the race the lane often won in a real npud (it logged "driver reference
    (background lane) is up" above "driver reference is up"), made certain. With
    ``fail``, that start then fails (a main host that does not come up)."""

    fail = False

    async def _handshake(self, slot: Any, conn: Any) -> None:
        if slot.background is not None:
            await slot.background.ready.wait()
            if self.fail:
                self.fail = False  # its restart comes up
                raise RuntimeError("scripted: the main host did not answer")
        await super()._handshake(slot, conn)


@pytest.mark.slow
@pytest.mark.parametrize("fail", [False, True], ids=["main-slow", "main-fails-first"])
def test_the_lane_is_said_up_after_its_main_host(runtime_dir: Path, state_dir: Path,
                                                 caplog: pytest.LogCaptureFixture,
                                                 fail: bool) -> None:
    cfg = Config.load(overrides={"driver": [{
        "name": "fake", "plugin": FAKE, "background_host": True,
        "restart_backoff_s": 0.05}]})
    events = Events()

    async def main() -> None:
        sup = LaneFirst(cfg, runtime_dir, events, MonotonicClock(), state_dir=state_dir)
        sup.fail = fail
        await sup.start()
        lane = sup.lanes[0]
        assert lane.up  # up before its main host, as arranged; only its line waited
        while not sup.slots[0].up:
            await asyncio.sleep(0.02)
        await sup.stop()

    with caplog.at_level(logging.INFO, "npumanager.service.supervisor"):
        asyncio.run(main())
    said = [r.getMessage() for r in caplog.records
            if r.name == "npumanager.service.supervisor" and " is " in r.getMessage()]
    said = [re.sub(r" \(pid .*", "", re.sub(r" \(scripted.*", "", m)) for m in said]
    want = ["driver fake is up", "driver fake (background lane) is up"]
    if fail:
        want = ["driver fake is down", "driver fake (background lane) is up",
                "driver fake is up"]
    assert said == want, said
