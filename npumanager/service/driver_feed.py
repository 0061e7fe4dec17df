"""What npud tells its driver hosts (part of :class:`~.supervisor.DriverSupervisor`, the
daemon's ``DriverControl``): the scheduling table, the live grants (each on its own
device's driver only) and the thermal status. Each is pushed as it changes to every up
driver, in order and before npud answers its client (a grant reaches the driver before
the client can use it), and replayed in full whenever a host (re)attaches, so a restarted
or adopted driver knows what the one before it knew. A device with a background lane
(:mod:`.host_lanes`) has two hosts: the table and thermal status go to both, each grant to
the one it is valid on, and moved to the other when its uid's class changes
(:mod:`.grant_moves`)."""

from __future__ import annotations

from typing import Any

from npumanager.constants import ThermalStatus
from npumanager.hal.types import DEBOUNCE_DURATION_MS, SchedulingConfig, default_config
from npumanager.hal.wire import configs_msg
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.service.driver_slots import DriverSlot
from npumanager.service.grant_moves import GrantMoves
from npumanager.service.host_lanes import grant_target
from npumanager.wire.conn import RpcConnection


class DriverFeed(GrantMoves):
    """The pushes; the supervisor owns the slots and their connections."""

    def __init__(self) -> None:
        self.table: dict[int, SchedulingConfig] = {}
        #: grant id -> (uid, request id, the driver it is valid on, the lane of its host,
        #: its request's model priority: what the rule routed it by)
        self.grants: dict[str, tuple[int, int, str, str, int]] = {}
        #: grant id -> the lane of the host that reported holding it when it attached
        #: (an adopted host): a restarted npud tells the grant to that host again.
        self.held_lanes: dict[str, str] = {}
        #: grant id -> the lane of the host it moved away from, which still knows it
        #: (its app's models there serve until it follows): its end goes there too.
        self.left_on: dict[str, str] = {}
        #: grant id -> how many times it moved (while live).
        self.grant_moves: dict[str, int] = {}
        #: device -> its moves since npud started (the dump's grant_moves is their sum;
        #: npu_grant_moves_total).
        self.device_moves: dict[str, int] = {}
        self.thermal = ThermalStatus.NONE  # the machine's
        self.own_thermal: dict[str, ThermalStatus] = {}  # a driver's own (its devices')

    def set_scheduling_configs(self, table: list[SchedulingConfig]) -> None:
        self.table = {c.uid: c for c in table}
        self._push_all("hal.set_scheduling_configs", configs_msg(table))
        self.move_grants()

    def update_scheduling_configs(self, entries: list[SchedulingConfig]) -> None:
        for c in entries:
            self.table[c.uid] = c
        self._push_all("hal.update_scheduling_configs", configs_msg(entries))
        self.move_grants({c.uid for c in entries})

    def driver_of(self, device: str) -> DriverSlot | None:
        """The slot serving ``device`` (``DRIVER`` or ``DRIVER:DEVICE``), if any."""
        for slot in self.slots:
            if device == slot.name or device.startswith(slot.name + ":"):
                return slot
        return None

    def grant_issued(self, uid: int, request_id: int, grant_id: str, device: str = "",
                     priority: int = 0) -> None:
        # A grant is valid on its device only: only that device's driver hears of it, so
        # a prepare on any other device is refused (GrantRequired) by its own driver; and
        # on one host of it: the one that holds it after an npud restart, else by the
        # request's effective class (_rule).
        slot = self.driver_of(device)
        held = self.held_lanes.pop(grant_id, None)
        if slot is None:
            target = None
        elif held is not None:
            target = slot.background if held and slot.background is not None else slot
        else:
            target = self._rule(slot, uid, priority)
        self.grants[grant_id] = (uid, request_id, slot.name if slot is not None else "",
                                 target.lane if target is not None else "", priority)
        msg = pb.GrantIssued(uid=uid, request_id=request_id, grant_id=grant_id)
        if target is None:
            self._push_all("hal.grant_issued", msg)
        else:
            self._push(target, "hal.grant_issued", msg)
        if held is not None:  # adopted where it was held: where the rule puts it now
            other = self.left_on.get(grant_id)
            if target is not None and slot is not None and other is not None:
                self._push(self._host(slot, other), "hal.grant_moved",
                           pb.GrantMoved(grant_id=grant_id, lane=target.lane))
            self.move_grants({uid}, only=grant_id)

    def request_lanes(self) -> dict[tuple[int, int], str]:
        """(uid, request id) -> the lane of the host its live grant is valid on, for the
        grants on a device with a background lane (npu status/top show it)."""
        with_lane = {s.name for s in self.slots if s.background is not None}
        return {(uid, rid): lane for uid, rid, driver, lane, _ in self.grants.values()
                if driver in with_lane}

    def _rule(self, slot: DriverSlot, uid: int, priority: int) -> DriverSlot:
        """The host of ``slot``'s device the rule puts a new grant of ``uid``'s on
        (host_lanes.grant_target: ``priority`` is the request's; the uid's row is the
        one the drivers have)."""
        return grant_target(slot, priority, self.table.get(uid) or default_config(uid))

    def note_held(self, slot: DriverSlot, grant_ids: list[str]) -> None:
        """``slot``'s host attached holding ``grant_ids`` (it outlived an npud): their
        host, for when npud adopts them (grant_issued)."""
        for gid in grant_ids:
            first = self.held_lanes.get(gid)
            if first is not None and first != slot.lane:
                # Both hosts hold it (it had moved, its app not yet followed): told to the
                # first, moved away from this one (grant_issued), its end to both.
                self.left_on[gid] = slot.lane
            else:
                self.held_lanes[gid] = slot.lane

    def grant_lane(self, grant_id: str) -> str:
        """The lane of the host a live grant is valid on ("": its device's main host)."""
        entry = self.grants.get(grant_id)
        return entry[3] if entry is not None else ""

    def grant_ended(self, grant_id: str, revoked: bool, *, ack: bool = False) -> None:
        entry = self.grants.pop(grant_id, None)
        self.held_lanes.pop(grant_id, None)  # (a held grant no client claimed)
        self.grant_moves.pop(grant_id, None)
        left = self.left_on.pop(grant_id, None)
        msg = pb.GrantEnded(grant_id=grant_id, revoked=revoked, ack=ack)
        slot = self.driver_of(entry[2]) if entry is not None and entry[2] else None
        if slot is None:
            # A grant npud did not issue (an adopted one no client claimed): every host
            # drops it; only main hosts are asked to acknowledge, as before lanes.
            for s in self.slots:
                self._push(s, "hal.grant_ended", msg)
            for lane in self.lanes:
                self._push(lane, "hal.grant_ended",
                           pb.GrantEnded(grant_id=grant_id, revoked=revoked))
            return
        assert entry is not None
        # Every host that knows it: the one it is valid on, and the one it moved away
        # from (the app's models there, if it never followed, are freed with it). The
        # main host's acknowledgement is awaited first: a lane that is down applies its
        # part at once, and npud hears the end applied once both are (_other_owes).
        for name in sorted({entry[3], *([] if left is None else [left])}):
            target = self._host(slot, name)
            self._push(target, "hal.grant_ended", msg)
            if ack:
                self._await_ack(target, grant_id)

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
        for s in self.all_slots() if slot is None else [slot, *_lane(slot)]:
            self._push(s, "hal.set_thermal_status",
                       pb.ThermalStatusMsg(status=int(self.thermal_of(s))))

    def thermal_of(self, slot: DriverSlot) -> ThermalStatus:
        return max(self.thermal, self.own_thermal.get(slot.name, ThermalStatus.NONE))

    async def _replay(self, slot: DriverSlot, conn: RpcConnection) -> None:
        """A host just attached: the table, npud as its one HAL callback, the grants valid
        on it and the thermal status, before it is marked up."""
        await conn.call("hal.set_scheduling_configs", configs_msg(list(self.table.values())))
        await conn.call("hal.set_callback", pb.SetCallback(debounce_ms=DEBOUNCE_DURATION_MS))
        for grant_id, (uid, request_id, driver, lane, _) in self.grants.items():
            if driver == "" or (driver == slot.name and lane == slot.lane):
                conn.push("hal.grant_issued",
                          pb.GrantIssued(uid=uid, request_id=request_id, grant_id=grant_id))
        if self.thermal_of(slot) != ThermalStatus.NONE:
            conn.push("hal.set_thermal_status",
                      pb.ThermalStatusMsg(status=int(self.thermal_of(slot))))

    def _push_all(self, method: str, msg: Any) -> None:
        for slot in self.all_slots():
            self._push(slot, method, msg)

    @staticmethod
    def _push(slot: DriverSlot, method: str, msg: Any) -> None:
        # Pushes go out synchronously, in order, before npud answers its client
        # (a grant reaches the driver before the client can use it).
        if slot.up and slot.conn is not None and not slot.conn.closed:
            slot.conn.push(method, msg)


def _lane(slot: DriverSlot) -> list[DriverSlot]:
    return [slot.background] if slot.background is not None else []
