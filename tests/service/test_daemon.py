"""npud's async shell in-process: instruction order, timers on a virtual clock, driver
events, bug containment and logs. Client and daemon share one event loop here."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from npumanager import (
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelPriority,
    ModelSize,
    RequestStatus,
    ThermalStatus,
    UnloadReason,
)
from npumanager.client import AsyncNpuManager
from npumanager.config import Config
from npumanager.errors import InternalError, InvalidArgument
from npumanager.hal.types import EndReason, SchedulingConfig, WorkInfo
from npumanager.proto.v1.common_pb2 import DeviceInfo
from npumanager.service import events as ev
from npumanager.service.daemon import Daemon, drivers_enabled, make_driver_control
from npumanager.service.driver_link import NoDrivers
from npumanager.service.logs import JsonFormatter, decision, setup_logging
from npumanager.testing import VirtualClock


class RecordingDrivers(NoDrivers):
    """A DriverControl that writes every call into a shared log."""

    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log = log

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo(name="fake", version="1", available=True, channels=2)]

    def grant_issued(self, uid: int, request_id: int, grant_id: str, device: str = "",
                     priority: int = 0) -> None:
        self.log.append(("driver.grant_issued", request_id, grant_id, device))

    def grant_ended(self, grant_id: str, revoked: bool, *, ack: bool = False) -> None:
        self.log.append(("driver.grant_ended", grant_id, revoked))

    def update_scheduling_configs(self, entries: list[SchedulingConfig]) -> None:
        self.log.append(("driver.update", tuple(entries)))

    def set_scheduling_configs(self, table: list[SchedulingConfig]) -> None:
        self.log.append(("driver.table", tuple(table)))

    def set_thermal_status(self, status: ThermalStatus, device: str = "") -> None:
        self.log.append(("driver.thermal", status) if not device
                        else ("driver.thermal", status, device))


class Recorder(ModelLoadRequestCallback):
    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log = log

    def on_can_load_model(self, request: ModelLoadRequest, status: LoadStatus,
                          listener: Any) -> None:
        self.log.append(("client.can_load", request.id, status, listener.grant_id))

    def on_request_unload_model(self, request: ModelLoadRequest, reason: UnloadReason) -> None:
        self.log.append(("client.unload", request.id, reason))

    def on_model_load_request_complete(self, request: ModelLoadRequest,
                                       status: RequestStatus) -> None:
        self.log.append(("client.complete", request.id, status))


Scenario = Callable[[Daemon, AsyncNpuManager, list[tuple[Any, ...]], VirtualClock],
                    Awaitable[None]]


def run_scenario(runtime_dir: Path, scenario: Scenario, sections: dict[str, Any] | None = None,
                 drivers: Callable[[list[tuple[Any, ...]]], Any] | None = None,
                 **manager: Any) -> Daemon:
    log: list[tuple[Any, ...]] = []
    clock = VirtualClock()
    cfg = Config.load(overrides={"manager": {"drivers": False, **manager}, **(sections or {})})

    async def main() -> Daemon:
        d = Daemon(cfg, runtime_dir, clock=clock, drivers=(drivers or RecordingDrivers)(log))
        await d.start()
        mgr = await AsyncNpuManager.connect(runtime_dir)
        try:
            await scenario(d, mgr, log, clock)
        finally:
            await mgr.close()
            await asyncio.sleep(0)
            await d.stop()
        return d

    return asyncio.run(main())


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_instruction_order_grant_then_push_then_end(runtime_dir: Path) -> None:
    seen: list[tuple[Any, ...]] = []

    async def scenario(d: Daemon, mgr: AsyncNpuManager, log: list[tuple[Any, ...]],
                       clock: VirtualClock) -> None:
        req = ModelLoadRequest(1)
        listener = await mgr.request_can_load_model(req, Recorder(log))
        await settle()
        await listener.notify_model_loaded(req)
        await listener.notify_model_unloaded(req)
        await settle()
        seen.extend(log)

    run_scenario(runtime_dir, scenario)
    # At start npud tells the drivers root is foreground (as it ranks root's requests).
    assert seen[0] == ("driver.update", (SchedulingConfig(0, 100),))
    seen = seen[1:]
    kinds = [e[0] for e in seen]
    assert kinds == ["driver.grant_issued", "client.can_load", "driver.grant_ended",
                     "client.complete"]
    grant = seen[0][2]
    assert seen[1] == ("client.can_load", 1, LoadStatus.CAN_LOAD_NOW, grant)
    assert seen[2] == ("driver.grant_ended", grant, False)
    assert seen[3] == ("client.complete", 1, RequestStatus.COMPLETE)


def test_unload_deadline_runs_on_the_virtual_clock_and_revokes(runtime_dir: Path) -> None:
    seen: list[tuple[Any, ...]] = []

    async def scenario(d: Daemon, mgr: AsyncNpuManager, log: list[tuple[Any, ...]],
                       clock: VirtualClock) -> None:
        # A background holder (rank 1100) must leave at SEVERE; it never reports unloaded.
        req = ModelLoadRequest(1, ModelSize.LESS_THAN_1GB, ModelPriority.BACKGROUND)
        listener = await mgr.request_can_load_model(req, Recorder(log))
        await listener.notify_model_loaded(req)
        await mgr.override_thermal_status(ThermalStatus.SEVERE)
        await settle()
        assert ("client.unload", 1, UnloadReason.THERMAL) in log
        assert d.armed_timers, "no unload deadline armed"
        (deadline,) = d.armed_timers.values()
        clock.advance(4.9)  # not due yet: the timer waits on the daemon's (virtual) clock
        assert list(d.armed_timers.values()) == [deadline]
        clock.advance(0.2)  # due: it fires as the clock passes it
        assert d.armed_timers == {}
        await settle()
        seen.extend(log)

    run_scenario(runtime_dir, scenario, unload_deadline_s=5.0)
    grant = next(e[2] for e in seen if e[0] == "driver.grant_issued")
    assert ("driver.grant_ended", grant, True) in seen
    assert seen[-1] == ("client.complete", 1, RequestStatus.REVOKED)
    assert ("driver.thermal", ThermalStatus.SEVERE) in seen


def test_a_bug_in_the_state_is_an_internal_error_and_npud_keeps_serving(
        runtime_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(d: Daemon, mgr: AsyncNpuManager, log: list[tuple[Any, ...]],
                       clock: VirtualClock) -> None:
        real = d.state.handle
        calls = {"n": 0}

        def buggy(event: ev.Event) -> list[ev.Instruction]:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("simulated bug")
            result: list[ev.Instruction] = real(event)
            return result

        d.state.handle = buggy  # type: ignore[method-assign]
        with pytest.raises(InternalError, match="keeps serving"):
            await mgr.request_can_load_model(ModelLoadRequest(1), Recorder(log))
        await mgr.request_can_load_model(ModelLoadRequest(2), Recorder(log))
        await settle()
        dump = await mgr.dump()
        assert dump["daemon"]["internal_errors"] == 1
        assert [r["request_id"] for r in dump["requests"]] == [2]

    with caplog.at_level(logging.ERROR):
        run_scenario(runtime_dir, scenario)
    assert "simulated bug" in caplog.text


def test_caller_mistakes_come_back_typed_and_change_nothing(runtime_dir: Path) -> None:
    async def scenario(d: Daemon, mgr: AsyncNpuManager, log: list[tuple[Any, ...]],
                       clock: VirtualClock) -> None:
        req = ModelLoadRequest(1)
        await mgr.request_can_load_model(req, Recorder(log))
        await mgr.cancel_model_load(req)
        await settle()
        with pytest.raises(InvalidArgument):  # reused id on this connection
            await mgr.request_can_load_model(req, Recorder(log))
        assert (await mgr.dump())["requests"] == []

    run_scenario(runtime_dir, scenario)


def test_driver_events_become_state_events_with_stimulus_ids(runtime_dir: Path) -> None:
    events: list[ev.Event] = []

    async def scenario(d: Daemon, mgr: AsyncNpuManager, log: list[tuple[Any, ...]],
                       clock: VirtualClock) -> None:
        real = d.state.handle

        def spy(event: ev.Event) -> list[ev.Instruction]:
            events.append(event)
            result: list[ev.Instruction] = real(event)
            return result

        d.state.handle = spy  # type: ignore[method-assign]
        d.driver_up(DeviceInfo(name="fake", memory_bytes=8 << 30))
        info = WorkInfo(id=1, group_id=None, uid=0, debug_pid=1, original_uid=0,
                        debug_feature_id=None, job_priority=0, effective_priority=100,
                        timestamp_ms=0, device_number=0)
        d.work_ended("fake", info, EndReason.COMPLETED)
        d.model_memory("fake", "no-such-grant", 1234)
        d.driver_down("fake", "crashed")
        req = ModelLoadRequest(1)
        await mgr.request_can_load_model(req, Recorder(log))
        devices = await mgr.devices()
        assert [x.name for x in devices] == ["fake"]
        await mgr.close()
        await settle()

    run_scenario(runtime_dir, scenario)
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["DriverUp", "WorkEnded", "ModelMemory", "DriverDown", "RequestLoad",
                     "ClientGone"]
    ids = [e.stimulus_id for e in events]
    assert len(set(ids)) == len(ids)
    assert ids[0].startswith("driver-up-") and ids[-1].startswith("gone-")


def test_driver_factory_honours_drivers_off() -> None:
    cfg = Config.load(overrides={"manager": {"drivers": False}})
    assert not drivers_enabled(cfg)
    assert isinstance(make_driver_control(cfg, Path("/tmp"), None, VirtualClock()),  # type: ignore[arg-type]
                      NoDrivers)
    assert drivers_enabled(Config.load())  # the default config starts the reference driver


def test_json_logs_are_one_object_per_line_with_the_decision_fields() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    setup_logging("json", "info", stream)
    try:
        decision("granted", uid=1000, request_id=7, status="CAN_LOAD_NOW")
        logging.getLogger("npumanager.npud").warning("plain %s", "message")
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)
    lines = [json.loads(x) for x in stream.getvalue().splitlines()]
    assert lines[0]["decision"] == "granted" and lines[0]["uid"] == 1000
    assert lines[0]["request_id"] == 7 and lines[0]["level"] == "info"
    assert lines[1]["msg"] == "plain message"
    assert isinstance(JsonFormatter().format(logging.makeLogRecord({"msg": "x"})), str)


def test_app_table_sets_importance_and_keeps_each_apps_limits(runtime_dir: Path) -> None:
    seen: list[tuple[Any, ...]] = []
    apps = {"app": [{"uid": 50001, "importance": "foreground", "min_priority": 10,
                     "max_priority": 500, "attribute_other_uid": True}]}

    async def scenario(d: Daemon, mgr: AsyncNpuManager, log: list[tuple[Any, ...]],
                       clock: VirtualClock) -> None:
        assert (await mgr.dump())["uids"]["50001"]["importance"] == 100
        await mgr.set_uid_importance(50001, 400)
        await settle()
        seen.extend(log)

    run_scenario(runtime_dir, scenario, sections=apps)
    [table] = [e[1] for e in seen if e[0] == "driver.table"]
    assert table == (SchedulingConfig(50001, 100, 10, 500, True, True),)
    updates = [c for e in seen if e[0] == "driver.update" for c in e[1]]
    # The importance change moves app_priority and keeps the configured limits and rights.
    assert updates[-1] == SchedulingConfig(50001, 400, 10, 500, True, True)
