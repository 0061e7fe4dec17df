"""The restart check: the driver under npud's supervisor is killed; the supervisor
restarts it and pushes the scheduling table again (observed through behaviour)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npumanager.clock import MonotonicClock
from npumanager.config import Config
from npumanager.errors import DeviceUnavailable, DirectAccessDenied
from npumanager.hal.types import EndReason, SchedulingConfig, WorkInfo
from npumanager.nn.device import Device
from npumanager.proto.v1.common_pb2 import DeviceInfo
from npumanager.testing.conformance.harness import ConformanceTarget

if TYPE_CHECKING:
    from npumanager.service.supervisor import DriverSupervisor


class _Events:
    def __init__(self) -> None:
        self.ups: list[str] = []
        self.downs: list[str] = []
        self.cond = threading.Condition()

    def driver_up(self, info: DeviceInfo) -> None:
        with self.cond:
            self.ups.append(info.name)
            self.cond.notify_all()

    def driver_down(self, name: str, reason: str) -> None:
        with self.cond:
            self.downs.append(reason)
            self.cond.notify_all()

    def work_ended(self, driver: str, info: WorkInfo, reason: EndReason) -> None:
        pass

    def model_memory(self, driver: str, grant_id: str, nbytes: int) -> None:
        pass

    def grant_end_applied(self, driver: str, grant_id: str) -> None:
        pass

    def wait_ups(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while len(self.ups) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"driver came up {len(self.ups)} times, wanted {n}; "
                                         f"downs: {self.downs}")
                self.cond.wait(left)


def check_driver_restart_and_table_push(target: ConformanceTarget, runtime_dir: Path) -> None:
    """Kill the supervised driver: clients get DeviceUnavailable, the supervisor restarts it
    and re-pushes the table (a uid without direct access stays refused afterwards)."""
    from npumanager.service.supervisor import DriverSupervisor

    entry: dict[str, Any] = {"name": target.name, "plugin": target.plugin or target.name,
                             "options": target.options if target.supervised_options is None
                             else target.supervised_options, "restart_backoff_s": 0.05}
    cfg = Config.load(overrides={"driver": [entry], "manager": {"enforce_admission": False}})
    events = _Events()
    loop = asyncio.new_event_loop()
    sup = DriverSupervisor(cfg, runtime_dir, events, MonotonicClock(),
                           state_dir=target.state_dir)
    started = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)

        async def main() -> None:
            await sup.start()
            started.set()

        loop.run_until_complete(main())
        loop.run_forever()

    th = threading.Thread(target=run, daemon=True)
    th.start()
    dev = Device(target.name, runtime_dir)
    try:
        started.wait(60)
        events.wait_ups(1)
        table = [SchedulingConfig(uid=os.getuid(), app_priority=100, has_direct_access=False)]
        push_table(sup, loop, table)
        model = dev.prepare_model(target.model)
        _expect(DirectAccessDenied, model.execute, target.inputs)
        slot = sup.slots[0]
        assert slot.proc is not None
        os.kill(slot.proc.pid, signal.SIGKILL)
        _expect(DeviceUnavailable, model.execute, target.inputs)
        events.wait_ups(2)
        assert events.downs, "the death was not reported"
        model = dev.prepare_model(target.model)
        _expect(DirectAccessDenied, model.execute, target.inputs)
        model.release()
    finally:
        dev.close()
        asyncio.run_coroutine_threadsafe(sup.stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        th.join(30)
        loop.close()


def push_table(sup: DriverSupervisor, loop: asyncio.AbstractEventLoop,
               table: list[SchedulingConfig], timeout: float = 60.0) -> None:
    """Push ``table`` from the supervisor's loop and return once every up driver has
    applied it: a round trip on its manager connection, whose frames the host handles in
    order (``wait_applied``).

    Not merely scheduled on the loop: a prepare sent meanwhile reaches the host on its own
    connection and may come first. The uid has no entry then (priority
    UNKNOWN_UID_PRIORITY, BACKGROUND), so its model compiles on the host's SCHED_IDLE
    compile thread, and so do the compiler processes it starts; a machine kept busy by
    normal-priority work runs those close to never (the check's prepare got no answer for
    300 s in a loaded full suite; beside three busy loops on 2 vCPUs, 1 of 4 runs)."""

    async def push() -> None:
        sup.set_scheduling_configs(table)
        await sup.wait_applied()

    asyncio.run_coroutine_threadsafe(push(), loop).result(timeout)


def _expect(exc: type[BaseException], fn: Any, *args: Any) -> None:
    try:
        fn(*args)
    except exc:
        return
    raise AssertionError(f"expected {exc.__name__}")
