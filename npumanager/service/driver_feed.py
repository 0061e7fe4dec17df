"""What npud tells its driver hosts (part of :class:`~.supervisor.DriverSupervisor`, the
daemon's ``DriverControl``): the scheduling table, the live grants (each on its own
device's driver only) and the thermal status. Each is pushed as it changes to every up
driver, in order and before npud answers its client (a grant reaches the driver before
the client can use it), and replayed in full whenever a host (re)attaches, so a restarted
or adopted driver knows what the one before it knew."""

from __future__ import annotations

from typing import Any

from npumanager.constants import ThermalStatus
from npumanager.hal.types import DEBOUNCE_DURATION_MS, SchedulingConfig
from npumanager.hal.wire import configs_msg
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.service.driver_slots import DriverSlot
from npumanager.wire.conn import RpcConnection


class DriverFeed:
    """The pushes; the supervisor owns the slots and their connections."""

    slots: list[DriverSlot]

    def __init__(self) -> None:
        self.table: dict[int, SchedulingConfig] = {}
        #: grant id -> (uid, request id, the driver it is valid on)
        self.grants: dict[str, tuple[int, int, str]] = {}
        self.thermal = ThermalStatus.NONE  # the machine's
        self.own_thermal: dict[str, ThermalStatus] = {}  # a driver's own (its devices')

    def set_scheduling_configs(self, table: list[SchedulingConfig]) -> None:
        self.table = {c.uid: c for c in table}
        self._push_all("hal.set_scheduling_configs", configs_msg(table))

    def update_scheduling_configs(self, entries: list[SchedulingConfig]) -> None:
        for c in entries:
            self.table[c.uid] = c
        self._push_all("hal.update_scheduling_configs", configs_msg(entries))

    def driver_of(self, device: str) -> DriverSlot | None:
        """The slot serving ``device`` (``DRIVER`` or ``DRIVER:DEVICE``), if any."""
        for slot in self.slots:
            if device == slot.name or device.startswith(slot.name + ":"):
                return slot
        return None

    def grant_issued(self, uid: int, request_id: int, grant_id: str, device: str = "") -> None:
        # A grant is valid on its device only: only that device's driver hears of it, so
        # a prepare on any other device is refused (GrantRequired) by its own driver.
        slot = self.driver_of(device)
        self.grants[grant_id] = (uid, request_id, slot.name if slot is not None else "")
        msg = pb.GrantIssued(uid=uid, request_id=request_id, grant_id=grant_id)
        if slot is None:
            self._push_all("hal.grant_issued", msg)
        else:
            self._push(slot, "hal.grant_issued", msg)

    def grant_ended(self, grant_id: str, revoked: bool, *, ack: bool = False) -> None:
        entry = self.grants.pop(grant_id, None)
        msg = pb.GrantEnded(grant_id=grant_id, revoked=revoked, ack=ack)
        slot = self.driver_of(entry[2]) if entry is not None and entry[2] else None
        if slot is None:
            self._push_all("hal.grant_ended", msg)
        else:
            self._push(slot, "hal.grant_ended", msg)

    def set_thermal_status(self, status: ThermalStatus, device: str = "") -> None:
        """The machine's status (``device`` ""), or one device's own: each driver holds
        work back by the worse of the machine's and its own."""
        slot = self.driver_of(device) if device else None
        if device and slot is None:
            return
        if slot is None:
            self.thermal = status
        else:
            self.own_thermal[slot.name] = status
        for s in self.slots if slot is None else [slot]:
            self._push(s, "hal.set_thermal_status",
                       pb.ThermalStatusMsg(status=int(self.thermal_of(s))))

    def thermal_of(self, slot: DriverSlot) -> ThermalStatus:
        return max(self.thermal, self.own_thermal.get(slot.name, ThermalStatus.NONE))

    async def _replay(self, slot: DriverSlot, conn: RpcConnection) -> None:
        """A host just attached: the table, npud as its one HAL callback, the grants valid
        on it and the thermal status, before it is marked up."""
        await conn.call("hal.set_scheduling_configs", configs_msg(list(self.table.values())))
        await conn.call("hal.set_callback", pb.SetCallback(debounce_ms=DEBOUNCE_DURATION_MS))
        for grant_id, (uid, request_id, driver) in self.grants.items():
            if driver in ("", slot.name):
                conn.push("hal.grant_issued",
                          pb.GrantIssued(uid=uid, request_id=request_id, grant_id=grant_id))
        if self.thermal_of(slot) != ThermalStatus.NONE:
            conn.push("hal.set_thermal_status",
                      pb.ThermalStatusMsg(status=int(self.thermal_of(slot))))

    def _push_all(self, method: str, msg: Any) -> None:
        for slot in self.slots:
            self._push(slot, method, msg)

    @staticmethod
    def _push(slot: DriverSlot, method: str, msg: Any) -> None:
        # Pushes go out synchronously, in order, before npud answers its client
        # (a grant reaches the driver before the client can use it).
        if slot.up and slot.conn is not None and not slot.conn.closed:
            slot.conn.push(method, msg)
