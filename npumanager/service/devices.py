"""The devices npud arbitrates: one budget, one rank queue and one holder set per device.

A device is named as ``nn.devices()`` names it: ``DRIVER`` when its driver has
one device, ``DRIVER:DEVICE`` otherwise (:func:`npumanager.hal.devices.device_name`).
Each :class:`Device` has its own :class:`~.budget.Budget`, its own waiters
(queued in rank order, or parked) and its own holders, so a request competes only
with the holders of its device, and only they can be its victims.

:class:`DeviceTable` keeps them in order — the configured drivers' order, then
each driver's own device order — and learns them from the drivers:

* Before a driver first reports, it stands as a *placeholder* device named
  like the driver (``ManagerParams.drivers``): a request made meanwhile for the
  first device (``device=None``) or for the driver's name waits on it. When the
  driver reports its devices, the placeholder becomes the first of them (with
  its requests); the others are added after it. With no drivers configured (a
  pure manager, the state's tests) one anonymous placeholder, ``default``,
  stands for whichever driver reports first.
* A device its driver no longer reports, or whose driver is down, is *down*:
  its holders keep their grants (the driver is restarting), and under MEMORY
  its memory no longer counts for new grants. Devices are never forgotten.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from npumanager.constants import ThermalStatus
from npumanager.errors import InvalidArgument
from npumanager.service.budget import Budget
from npumanager.service.events import RequestKey
from npumanager.service.policy import ManagerParams, PolicySettings
from npumanager.service.ranking import ManagedRequest, RankQueue

#: The anonymous placeholder's name (no drivers configured).
DEFAULT_DEVICE = "default"


class Device:
    """One device's budget, waiters and holders."""

    __slots__ = ("budget", "driver", "holders", "name", "own_thermal", "parked", "placeholder",
                 "queue")

    def __init__(self, name: str, driver: str, params: ManagerParams, *,
                 placeholder: bool = False) -> None:
        self.name = name
        #: The driver that serves it ("" for the anonymous placeholder).
        self.driver = driver
        self.placeholder = placeholder
        self.budget = Budget(params, params.device_limits.get(name))
        self.queue = RankQueue()
        self.parked: dict[RequestKey, ManagedRequest] = {}
        self.holders: dict[RequestKey, ManagedRequest] = {}
        #: This device's own thermal status (its driver's thermal model); the budget's is
        #: the worse of it and the machine's.
        self.own_thermal = ThermalStatus.NONE

    def __repr__(self) -> str:
        what = " placeholder" if self.placeholder else ""
        return (f"<Device {self.name}{what} of {self.driver or '?'}: {self.budget.describe()}, "
                f"{len(self.holders)} holding, {len(self.queue) + len(self.parked)} waiting>")

    # --- its waiters: queued in rank order when eligible, else parked -----------------

    def park(self, req: ManagedRequest) -> None:
        req.parked = True
        self.parked[req.key] = req

    def place(self, req: ManagedRequest) -> None:
        if self.budget.eligible(req):
            self.queue.push(req)
        else:
            self.park(req)

    def unplace(self, req: ManagedRequest) -> None:
        if req.in_queue:
            self.queue.remove(req)
        elif req.parked:
            req.parked = False
            del self.parked[req.key]

    def rename(self, name: str, params: ManagerParams) -> None:
        self.name = name
        self.budget.limits = params.device_limits.get(name)
        self.budget.refresh()


class DeviceTable:
    """Every device npud knows, in order; ``first`` takes requests that name none."""

    __slots__ = ("by_name", "first", "params", "thermal")

    def __init__(self, params: ManagerParams) -> None:
        self.params = params
        #: The machine's thermal status; a device's budget follows the worse of it and its own.
        self.thermal = ThermalStatus.NONE
        self.by_name: dict[str, Device] = {}
        if params.drivers:
            for d in params.drivers:
                if d in self.by_name:
                    raise InvalidArgument(f"driver {d!r} is configured twice")
                self.by_name[d] = Device(d, d, params, placeholder=True)
        else:
            self.by_name[DEFAULT_DEVICE] = Device(DEFAULT_DEVICE, "", params, placeholder=True)
        self.first: Device = next(iter(self.by_name.values()))

    def __iter__(self) -> Iterator[Device]:
        return iter(self.by_name.values())

    def __len__(self) -> int:
        return len(self.by_name)

    def __repr__(self) -> str:
        return f"<DeviceTable {', '.join(self.by_name)}>"

    def describe(self) -> str:
        if len(self.by_name) == 1:
            return self.first.budget.describe()
        return "; ".join(f"{d.name} {d.budget.describe()}" for d in self)

    def set_thermal(self, status: ThermalStatus,
                    device: str | None) -> list[tuple[Device, ThermalStatus]]:
        """The machine's status (``device`` None) or one device's own: each device it
        applies to, with the status its budget followed before."""
        if device is None:
            self.thermal = status
            devs = list(self)
        else:
            dev = self.get(device)
            dev.own_thermal = status
            devs = [dev]
        return [(d, d.budget.set_thermal(max(self.thermal, d.own_thermal))) for d in devs]

    def get(self, name: str | None) -> Device:
        """The device a request names (None: the first); InvalidArgument naming the known."""
        if name is None or name == "":
            return self.first
        dev = self.by_name.get(name)
        if dev is None:
            raise InvalidArgument(
                f"unknown device {name!r}; npud has {', '.join(self.by_name)}")
        return dev

    def of_driver(self, driver: str) -> list[Device]:
        return [d for d in self.by_name.values() if d.driver == driver]

    def driver_up(self, driver: str, reports: Sequence[tuple[str, int]],
                  settings: PolicySettings) -> list[Device]:
        """``driver`` is up and serves ``reports`` ((device name, memory bytes), in its
        order) under ``settings``. Returns the driver's devices. InvalidArgument (nothing
        changed) when a name belongs to another driver's device or repeats, or a memory
        size is not a count of bytes."""
        for name, nbytes in reports:
            if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
                raise InvalidArgument(f"driver {driver}: memory of {name} must be >= 0 bytes")
        names = [n for n, _ in reports]
        if not reports or len(set(names)) != len(names) or any(not n for n in names):
            raise InvalidArgument(f"driver {driver!r} must report distinct, named devices; "
                                  f"got {names}")
        for n in names:
            other = self.by_name.get(n)
            if other is not None and other.driver not in (driver, ""):
                raise InvalidArgument(f"driver {driver!r} reports device {n!r}, which is "
                                      f"driver {other.driver!r}'s")
        before = list(self.by_name.values())  # the order to keep (renames move dict keys)
        owned = self.of_driver(driver)
        if not owned:
            anon = [d for d in self.by_name.values() if d.driver == "" and d.placeholder]
            if anon:
                owned = [anon[0]]
                anon[0].driver = driver
        spare = [d for d in owned if d.placeholder and d.name not in names]
        mine: list[Device] = []
        for name, memory in reports:
            dev = self.by_name.get(name)
            if dev is None and spare:
                dev = spare.pop(0)  # the placeholder becomes this device, requests and all
                del self.by_name[dev.name]
                dev.rename(name, self.params)
                self.by_name[name] = dev
            elif dev is None:
                dev = Device(name, driver, self.params)
                self.by_name[name] = dev
            dev.driver = driver
            dev.placeholder = False
            if dev.budget.settings is not settings:  # a device met for the first time
                dev.budget.set_policy(settings)
            dev.budget.set_thermal(max(self.thermal, dev.own_thermal))
            dev.budget.device_up(memory)
            mine.append(dev)
        rest = [d for d in self.of_driver(driver) if d not in mine]
        for d in rest:
            d.budget.device_down()
        self._reorder(before, driver, mine + rest)
        return mine + rest

    def driver_down(self, driver: str) -> list[Device]:
        devs = self.of_driver(driver)
        for d in devs:
            d.budget.device_down()
        return devs

    def _reorder(self, before: list[Device], driver: str, devs: list[Device]) -> None:
        """Keep the driver's devices together where its first one stood, in its order."""
        out: dict[str, Device] = {}
        placed = False
        for d in before:
            if d.driver == driver:
                if not placed:
                    out.update((x.name, x) for x in devs)
                    placed = True
                continue
            out[d.name] = d
        if not placed:
            out.update((x.name, x) for x in devs)
        self.by_name = out
        self.first = next(iter(out.values()))
