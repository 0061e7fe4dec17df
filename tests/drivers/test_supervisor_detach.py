"""npud's SIGTERM (a restart) while a driver host is still starting, with real host
processes: the replacement host a driver crash brought is waited for, attached and left
running for the next npud to adopt, never stopped; one that does not come up within the
detach bound holds nothing and is stopped. The host is held in "starting" by a gate file
(testing.fake_driver.GatedStartDriver), so nothing here depends on timing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from npumanager.clock import MonotonicClock
from npumanager.config import Config
from npumanager.proto.v1.common_pb2 import DeviceInfo
from npumanager.service.supervisor import DriverSupervisor
from npumanager.testing.daemon import driver_hosts, process_running
from tests.drivers.supervisor_thread import supervisor_on_a_thread

pytestmark = pytest.mark.slow

GATED = "npumanager.testing.fake_driver:GatedStartDriver"


class Events:
    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []

    def driver_up(self, info: DeviceInfo) -> None:
        self.log.append(("up", info.name))

    def driver_down(self, name: str, reason: str) -> None:
        self.log.append(("down", reason))

    def kinds(self) -> list[str]:
        return [k for k, _ in self.log]


class Running:
    def __init__(self, sup: DriverSupervisor, loop: asyncio.AbstractEventLoop,
                 events: Events) -> None:
        self.sup, self.loop, self.events = sup, loop, events

    def call(self, fn: Any) -> Any:
        """``fn()`` on the supervisor's loop (its state is the loop's alone)."""
        async def run() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)

    def until(self, what: str, fn: Any, timeout: float = 60.0) -> Any:
        """Poll ``fn`` on the loop until it returns something truthy."""
        deadline = time.monotonic() + timeout
        while not (got := self.call(fn)):
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)
        return got


@contextlib.contextmanager
def supervisor(runtime_dir: Path, state_dir: Path, gate: Path,
               detach_wait_s: float = 60.0) -> Iterator[Running]:
    cfg = Config.load(overrides={"driver": [{
        "name": "fake", "plugin": GATED, "channels": 1, "restart_backoff_s": 0.05,
        "options": {"start_gate": str(gate)}}]})
    events = Events()
    # startup_wait_s: npud's start does not wait for a gated host (the test does).
    sup = DriverSupervisor(cfg, runtime_dir, events, MonotonicClock(), state_dir=state_dir,
                           startup_wait_s=0.05, detach_wait_s=detach_wait_s)
    with supervisor_on_a_thread(sup) as loop:
        yield Running(sup, loop, events)


def _starting_pid(r: Running) -> int:
    """The pid of the slot's host while it is spawned and not yet attached, else 0."""
    slot = r.sup.slots[0]
    return slot.proc.pid if slot.proc is not None and not slot.up else 0


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 30
    while process_running(pid):
        assert time.monotonic() < deadline, f"host {pid} was not stopped"
        time.sleep(0.05)


def test_a_sigterm_while_the_replacement_host_starts_leaves_it_running_for_the_next_npud(
        runtime_dir: Path, state_dir: Path) -> None:
    """The chaos run's one violation ("npud's SIGTERM stopped its driver host"): the
    driver is SIGKILLed, npud starts a replacement at once, and npud's SIGTERM lands
    while that host is still starting. The detach waits for it, attaches it, and leaves
    it running; the next npud adopts it instead of starting a host of its own."""
    gate = runtime_dir / "gate"
    gate.touch()
    with supervisor(runtime_dir, state_dir, gate) as first:
        first.until("the first host", lambda: first.sup.slots[0].up)
        crashed = first.call(lambda: first.sup.slots[0].proc.pid)
        gate.unlink()  # the replacement will not be ready until the test says so
        os.kill(crashed, signal.SIGKILL)
        new = first.until("the replacement host, starting",
                          lambda: (p := _starting_pid(first)) != crashed and p)
        detach = asyncio.run_coroutine_threadsafe(first.sup.detach(), first.loop)
        first.until("the detach", lambda: first.sup.detaching)
        assert not detach.done()  # it waits for the starting host...
        assert process_running(new)
        gate.touch()  # ...which now comes up
        detach.result(60)
        assert first.events.kinds() == ["up", "down", "up"]  # the crash; no down after
        assert process_running(new), "npud's SIGTERM stopped its starting driver host"
        assert first.sup.slots[0].proc is None and first.sup.slots[0].starts == 2
    assert driver_hosts(runtime_dir) == [new]
    assert (runtime_dir / "drivers" / "fake.sock").exists()
    with supervisor(runtime_dir, state_dir, gate) as second:
        second.until("the adoption", lambda: second.sup.slots[0].up)
        slot = second.sup.slots[0]
        assert (slot.adopted_pid, slot.starts, slot.proc) == (new, 0, None)
    _wait_gone(new)  # the second one's final stop stopped the host it adopted


def test_a_host_that_does_not_come_up_within_the_detach_bound_is_stopped(
        runtime_dir: Path, state_dir: Path) -> None:
    """It never attached, so it holds nothing: nothing is lost, and no host is left
    behind that no npud knows of (only an attached host runs the orphan grace)."""
    gate = runtime_dir / "gate"  # never created
    with supervisor(runtime_dir, state_dir, gate, detach_wait_s=0.3) as r:
        pid = r.until("the host, starting", lambda: _starting_pid(r))
        asyncio.run_coroutine_threadsafe(r.sup.detach(), r.loop).result(60)
        assert r.events.kinds() == []
        assert r.sup.slots[0].starts == 1  # and no restart after the detach
    _wait_gone(pid)
    assert driver_hosts(runtime_dir) == []
