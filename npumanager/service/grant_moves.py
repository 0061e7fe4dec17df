"""A live grant follows its uid's class between its device's two hosts (part of
:class:`~.driver_feed.DriverFeed`).

A device with a background lane (:mod:`.host_lanes`) has two hosts, and npud decides
which one a grant is valid on when it grants (:func:`~.host_lanes.grant_target`). An
app's importance changes while it runs (``npu importance``, an [[app]] entry reloaded,
an adopted grant held where the rule no longer puts it): a camera loaded in the
background and then brought to the front would keep running on the lane's nice-19
threads, the app the user now looks at stuttering; a demoted one would keep costing the
foreground's host. So when the table changes, each live grant the rule now puts on the
other host moves there:

* the new host is told the grant (``hal.grant_issued``) before the old one hears that
  it moved (``hal.grant_moved``, with the new host's lane): when the app follows, the
  grant is there;
* the old host keeps serving the models prepared under it (no execution fails), says in
  each answer where the grant went, and prepares nothing new under it; the app's runtime
  re-prepares on the new host and releases the old copy (nn/model_move.py); an app that
  never follows keeps being served where it is;
* the grants entry records the new lane (npu status shows it), and the lane it left
  (``left_on``): its end goes to both hosts, npud waiting for both acknowledgements.

Bounded: a device has two hosts, so a grant is known to at most both; a move is two
pushes and O(1) bookkeeping, however often an admin flips a uid. A grant that flips back
before its app followed is told to the host it is on again (``hal.grant_issued`` of a
grant it still holds: the move is undone there) and the other host marks it moved."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.service.host_lanes import HostLanes

if TYPE_CHECKING:
    from npumanager.hal.types import SchedulingConfig
    from npumanager.service.driver_slots import DriverSlot

log = logging.getLogger("npumanager.service.supervisor")


class GrantMoves(HostLanes):
    """The moves; DriverFeed owns the table and the grants."""

    table: dict[int, SchedulingConfig]
    grants: dict[str, tuple[int, int, str, str, int]]
    left_on: dict[str, str]
    grant_moves: dict[str, int]
    device_moves: dict[str, int]

    if TYPE_CHECKING:
        def driver_of(self, device: str) -> DriverSlot | None: ...
        def _rule(self, slot: DriverSlot, uid: int, priority: int) -> DriverSlot: ...
        @staticmethod
        def _push(slot: DriverSlot, method: str, msg: object) -> None: ...

    def move_grants(self, uids: set[int] | None = None, *, only: str | None = None) -> None:
        """Move each live grant (of ``uids``; only ``only``) whose host the rule would no
        longer pick to the one it picks now."""
        for gid in [only] if only is not None else list(self.grants):
            entry = self.grants.get(gid)
            if entry is None:
                continue
            uid, _, driver, lane, priority = entry
            if uids is not None and uid not in uids:
                continue
            slot = self.driver_of(driver) if driver else None
            if slot is None or slot.background is None:
                continue
            new = self._rule(slot, uid, priority)
            if new.lane != lane:
                self._move(gid, slot, new)

    def _move(self, grant_id: str, slot: DriverSlot, new: DriverSlot) -> None:
        uid, rid, driver, lane, priority = self.grants[grant_id]
        old = self._host(slot, lane)
        self.grants[grant_id] = (uid, rid, driver, new.lane, priority)
        self.left_on[grant_id] = lane
        self.grant_moves[grant_id] = self.grant_moves.get(grant_id, 0) + 1
        self.device_moves[driver] = self.device_moves.get(driver, 0) + 1
        # The new host first: the app the old host's answer sends there finds it.
        self._push(new, "hal.grant_issued",
                   pb.GrantIssued(uid=uid, request_id=rid, grant_id=grant_id))
        self._push(old, "hal.grant_moved", pb.GrantMoved(grant_id=grant_id, lane=new.lane))
        log.info("grant %s… of uid %d moved from %s to %s (its class changed)",
                 grant_id[:8], uid, old.label, new.label)

    @staticmethod
    def _host(slot: DriverSlot, lane: str) -> DriverSlot:
        """The host of ``slot``'s device whose lane is ``lane`` ("": the main one)."""
        return slot.background if lane and slot.background is not None else slot

    def request_move_counts(self) -> dict[tuple[int, int], int]:
        """(uid, request id) -> how many times its live grant moved (npu status/top)."""
        return {(e[0], e[1]): self.grant_moves[gid] for gid, e in self.grants.items()
                if gid in self.grant_moves}


__all__ = ["GrantMoves"]
