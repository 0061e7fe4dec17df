"""npud (in process, virtual clock) with two devices: a request names its device, its
grant reaches that device's driver only, a driver's work and thermal status are charged
to its own device, and the dump shows one budget per device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from npumanager import LoadStatus, ModelLoadRequest, ModelSize, ThermalStatus
from npumanager.client import AsyncNpuManager
from npumanager.errors import InvalidArgument
from npumanager.hal.types import EndReason, WorkInfo
from npumanager.proto.v1.common_pb2 import DeviceInfo
from npumanager.service import events as ev
from npumanager.service.daemon import Daemon
from npumanager.testing import VirtualClock

from .test_daemon import Recorder, RecordingDrivers, run_scenario, settle

NPU, GPU = "npu", "gpu"


class TwoDevices(RecordingDrivers):
    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo(name=NPU, version="1", available=True, channels=1, device_number=0),
                DeviceInfo(name=GPU, version="1", available=True, channels=1, device_number=1)]


def _work(device_number: int) -> WorkInfo:
    return WorkInfo(id=1, group_id=None, uid=0, debug_pid=1, original_uid=0,
                    debug_feature_id=None, job_priority=0, effective_priority=100,
                    timestamp_ms=0, device_number=device_number)


def test_a_pinned_request_is_granted_on_its_device_only(runtime_dir: Path) -> None:
    seen: list[tuple[Any, ...]] = []
    dumps: list[dict[str, Any]] = []

    async def scenario(d: Daemon, mgr: AsyncNpuManager, log: list[tuple[Any, ...]],
                       clock: VirtualClock) -> None:
        d.driver_up(DeviceInfo(name=NPU, memory_bytes=4 << 30))
        d.driver_up(DeviceInfo(name=GPU, memory_bytes=8 << 30))
        big = ModelSize.GREATER_THAN_2G
        await mgr.request_can_load_model(ModelLoadRequest(1, big, device=GPU), Recorder(log))
        await mgr.request_can_load_model(ModelLoadRequest(2, big), Recorder(log))  # the first
        await settle()
        dumps.append(d.dump())
        seen.extend(log)

    run_scenario(runtime_dir, scenario, drivers=TwoDevices, policy="BUDGET", max_budget=4)
    grants = [e for e in seen if e[0] == "driver.grant_issued"]
    assert [(e[1], e[3]) for e in grants] == [(1, GPU), (2, NPU)]
    assert [e for e in seen if e[0] == "client.can_load"] == [
        ("client.can_load", 1, LoadStatus.CAN_LOAD_NOW, grants[0][2]),
        ("client.can_load", 2, LoadStatus.CAN_LOAD_NOW, grants[1][2])]
    budgets = {b["device"]: b for b in dumps[0]["budgets"]}
    assert (budgets[NPU]["used"], budgets[GPU]["used"]) == (4, 4)
    assert {r["request_id"]: r["device"] for r in dumps[0]["requests"]} == {1: GPU, 2: NPU}


def test_an_unknown_device_is_invalid_argument_naming_the_known(runtime_dir: Path) -> None:
    async def scenario(d: Daemon, mgr: AsyncNpuManager, log: list[tuple[Any, ...]],
                       clock: VirtualClock) -> None:
        with pytest.raises(InvalidArgument, match="npu, gpu"):
            await mgr.request_can_load_model(ModelLoadRequest(1, device="tpu"), Recorder(log))
        # npud keeps serving the same client.
        await mgr.request_can_load_model(ModelLoadRequest(2, device=NPU), Recorder(log))
        await settle()
        assert [e[0] for e in log] == ["driver.update",  # root is foreground: at start
                                       "driver.grant_issued", "client.can_load"]

    run_scenario(runtime_dir, scenario, drivers=TwoDevices)


def test_work_and_thermal_of_a_driver_go_to_its_own_device(runtime_dir: Path) -> None:
    events: list[ev.Event] = []
    seen: list[tuple[Any, ...]] = []

    async def scenario(d: Daemon, mgr: AsyncNpuManager, log: list[tuple[Any, ...]],
                       clock: VirtualClock) -> None:
        real = d.state.handle

        def spy(event: ev.Event) -> list[ev.Instruction]:
            events.append(event)
            out: list[ev.Instruction] = real(event)
            return out

        d.state.handle = spy  # type: ignore[method-assign]
        d.work_ended(GPU, _work(1), EndReason.COMPLETED)
        d.work_ended(NPU, _work(0), EndReason.COMPLETED)
        d.work_ended(GPU, _work(7), EndReason.COMPLETED)  # a number npud does not know
        d.submit_quietly(ev.ThermalChanged(stimulus_id="t", now=clock.now(),
                                           status=ThermalStatus.SEVERE, device=GPU))
        assert d.state.device_thermal(GPU) is ThermalStatus.SEVERE
        assert d.state.device_thermal(NPU) is ThermalStatus.NONE
        seen.extend(log)

    run_scenario(runtime_dir, scenario, drivers=TwoDevices)
    ended = [e for e in events if isinstance(e, ev.WorkEnded)]
    assert [e.device for e in ended] == [GPU, NPU, GPU]
    assert ("driver.thermal", ThermalStatus.SEVERE, GPU) in seen
