"""A device's second driver host process, its background lane ([[driver]] background_host).

Why a second process: the camera's slow frames while a model loads, with its host's burst
thread and its app's thread at SCHED_FIFO, were host-lock holds and GIL hand-offs in the
camera's host process, which the background steps, session builds and load messages
share; moving the background apps to a host process of their own removed them (bench
``rt+app+bg-own-host``: camera p99 while a model loads 0.4-0.5 ms, 0.64-0.96x its own
alone, in five of five full runs; bench/README.md "Real-time threads and a background host
together"). The bench built that from two devices; this is the product form: one device,
one budget, two host processes.

What npud does for a device with a background lane (the supervisor's part, a mixin of
:class:`~.supervisor.DriverSupervisor`):

* The lane is a :class:`DriverSlot` of its own (``lane = "background"``, ``main`` its
  device's slot): the same [[driver]] entry, user and keys (but for those its
  [driver.background] table sets for it alone), its own socket
  (``drivers/NAME.background.sock``, ``socket_mode`` as the main one), state dir
  (``NAME.background``: two processes never share a cache map), host record, restart
  back-off and adoption after an npud restart; npud's real-time, compile-raise and
  compile-watch handlers serve it tied to its own pid, like any host npud spawned.
* Grants (:mod:`.driver_feed`): each grant is told to one host of its device:
  :func:`grant_target` (the lane for a request whose effective class is BACKGROUND: a
  BACKGROUND or OPPORTUNISTIC request, or any request of a uid the driver runs as
  BACKGROUND; the main host otherwise; decided by npud when it grants and said to the app
  in the grant answer; moved to the other host when the uid's class changes later,
  :mod:`.grant_moves`); its end goes to the hosts that know it, which acknowledge the
  release. The other host does not know the
  grant, so a prepare there is refused (GrantRequired naming the lane): a background model
  in the foreground's host is what costs the camera.
* One device: the lane's capabilities are not reported (``nn.devices()`` numbering and the
  MEMORY policy's memory sum see the main host only); its work, memory and release reports
  name the device (the same name), so they feed its one budget.
* Up and down: the device is up while its main host is. The lane down (crashed, or being
  restarted) does not take the device down: the foreground's models keep serving; a
  BACKGROUND prepare gets DeviceUnavailable until it is back; grants stay (as after any
  host crash) and are told to it again when it attaches; ends waiting for its
  acknowledgement are applied (its process is gone and its models with it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from typing import Any

from npumanager.constants import ModelPriority
from npumanager.hal.exec_class import (
    DEFAULT_FOREGROUND_PRIORITY,
    ExecClass,
    model_class,
)
from npumanager.hal.host_config import lane_entry
from npumanager.hal.types import SchedulingConfig
from npumanager.paths import BACKGROUND_LANE
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.proto.v1.common_pb2 import DeviceInfo
from npumanager.service import host_entries
from npumanager.service.driver_link import DriverEvents
from npumanager.service.driver_slots import Backoff, DriverSlot
from npumanager.wire.conn import CallContext

log = logging.getLogger("npumanager.service.supervisor")


def make_lane(slot: DriverSlot, socket_path: str) -> DriverSlot:
    """The background lane of ``slot``'s device, linked both ways; its entry with its own
    [driver.background] keys (its back-off, real-time priority and compile bound)."""
    entry = lane_entry(slot.entry)
    lane = DriverSlot(
        name=slot.name, number=slot.number, entry=entry,
        backoff=Backoff(float(entry.get("restart_backoff_s", 0.2)),
                        float(entry.get("restart_backoff_max_s", 10.0))),
        info=DeviceInfo(name=slot.name, socket_path=socket_path, available=False,
                        device_number=slot.number),
        lane=BACKGROUND_LANE, main=slot)
    lane.group = [lane]
    slot.background = lane
    return lane


def grant_class(priority: int, config: SchedulingConfig, foreground_priority: int
                ) -> ExecClass:
    """A request's effective class when npud grants it: BACKGROUND for a BACKGROUND or
    OPPORTUNISTIC request (the app said so, whatever its uid's importance), else the class
    the device's driver runs its uid's models in (:func:`~npumanager.hal.exec_class.
    model_class`: the app priority npud told the driver, from the uid's importance or an
    [[app]] entry, against the driver's ``foreground_priority``). So a uid whose importance
    is a background one (a service, cached, an unknown uid's 1000) asking NORMAL is
    BACKGROUND: the driver would run its steps at the background class anyway."""
    if priority >= ModelPriority.BACKGROUND:
        return ExecClass.BACKGROUND
    return model_class(config, foreground_priority)


def grant_target(slot: DriverSlot, priority: int, config: SchedulingConfig) -> DriverSlot:
    """The host a new grant for a request of ``priority`` (ModelPriority) by ``config``'s
    uid (the driver's row for it) is valid on: the device's background lane when the
    request's :func:`grant_class` is BACKGROUND, its main host otherwise. Decided when
    npud grants (DriverFeed.grants records it) and again whenever the drivers' table
    changes: a live grant the rule now puts on the other host moves there
    (:mod:`.grant_moves`); a restarted npud that adopts the grant tells it first to the
    host that reported holding it (DriverFeed.held_lanes), then moves it likewise."""
    lane = slot.background
    if lane is None:
        return slot
    foreground = int(slot.entry.get("foreground_priority", DEFAULT_FOREGROUND_PRIORITY))
    return lane if grant_class(priority, config, foreground) is ExecClass.BACKGROUND else slot


class HostLanes:
    """The supervisor's lane bookkeeping (it owns the slots and their processes)."""

    slots: list[DriverSlot]
    lanes: list[DriverSlot]
    events: DriverEvents

    def all_slots(self) -> list[DriverSlot]:
        """Every host npud runs: each device's main one, then the background lanes."""
        return [*self.slots, *self.lanes]

    def _say_up(self, slot: DriverSlot, msg: str, *args: object) -> None:
        """Log that ``slot``'s host is up (or adopted). A lane's line waits until its main
        host's first start has ended: npud starts the two together and the lane, the
        lighter start, often answers first, and its line above its device's read as if the
        background lane served a device that was not up yet. Its line is said right
        after the main host's, or after its "is down" when that start failed."""
        main = slot.main
        if main is not None and not main.ready.is_set():
            slot.unsaid_up = (msg, args)
            return
        log.info(msg, *args)
        self._say_lane_up(slot)

    @staticmethod
    def _say_lane_up(slot: DriverSlot) -> None:
        """The up line of ``slot``'s lane (or of the lane ``slot`` is), if it is held."""
        lane = slot.background or slot
        if lane.unsaid_up is not None:
            msg, args = lane.unsaid_up
            lane.unsaid_up = None
            log.info(msg, *args)

    def _announce_up(self, slot: DriverSlot) -> None:
        if slot.lane:  # the caller logged its start, as for any host
            return
        self.events.driver_up(slot.info)

    def _announce_down(self, slot: DriverSlot, reason: str) -> None:
        """A host that was up is gone; its process and its models with it."""
        if not slot.lane:
            slot.acks.clear()  # the device goes down: npud applies every end itself
            self.events.driver_down(slot.name, reason)
            return
        self._say_lane_up(slot)  # (said before its down, where its main host is slow)
        log.warning("driver %s is down (%s); device %s keeps serving on its main host",
                    slot.label, reason, slot.name)
        self._applied_for(slot, sorted(slot.acks))
        slot.acks.clear()

    def _await_ack(self, slot: DriverSlot, grant_id: str) -> None:
        """npud asked ``slot``'s host to acknowledge the end of ``grant_id``. A lane that is
        not up holds no models: the end is applied now (the device being up, npud's state
        waits for an acknowledgement that would never come)."""
        if slot.up and slot.conn is not None and not slot.conn.closed:
            slot.acks.add(grant_id)
        elif slot.lane:
            self._applied_for(slot, [grant_id])

    def _applied_for(self, slot: DriverSlot, grant_ids: list[str]) -> None:
        # Soon, not now: this runs inside the daemon carrying out the state's instructions.
        loop = asyncio.get_running_loop()
        for gid in grant_ids:
            if not _other_owes(slot, gid):
                loop.call_soon(self.events.grant_end_applied, slot.name, gid)

    def _lane_handlers(self, slot: DriverSlot, handlers: dict[str, Any]) -> dict[str, Any]:
        """``handlers`` with the end acknowledgement noted for ``slot`` (restart() kills the
        host that has one outstanding). A grant that moved between the device's hosts
        (:mod:`.grant_moves`) ends on both: npud hears it applied once the second has."""
        forward = handlers["hal.grant_end_applied"]

        def on_end_applied(ctx: CallContext, payload: bytes) -> None:
            gid = pb.GrantEnded.FromString(payload).grant_id
            slot.acks.discard(gid)
            if not _other_owes(slot, gid):
                forward(ctx, payload)

        return {**handlers, "hal.grant_end_applied": on_end_applied}

    @staticmethod
    def _hung(slot: DriverSlot) -> list[DriverSlot]:
        """The hosts of ``slot``'s device to kill when npud's state says its driver is hung
        (an end not acknowledged in time): those still owing an acknowledgement, else the
        main one (a device without a lane: always its host)."""
        lane = slot.background
        if lane is None:
            return [slot]
        return [s for s in (slot, lane) if s.acks and s.up] or [slot]

    @staticmethod
    def _kill(slot: DriverSlot, reason: str) -> None:
        """SIGKILL ``slot``'s host (a hung one may not handle SIGTERM); its watch sees it
        go and restarts it with back-off."""
        slot.last_exit = reason
        if slot.proc is not None:
            slot.proc.kill()
        elif slot.adopted_pid > 0:
            with contextlib.suppress(OSError):  # gone already
                os.kill(slot.adopted_pid, signal.SIGKILL)
        for s in slot.group or [slot]:
            if s.conn is not None:
                s.conn.close()  # its watch ends now, whatever the process does

    def host_pids(self) -> dict[str, dict[str, Any]]:
        """Each device's host processes (`npu status`, device.stats): ``{device: {"pid":
        main host's, "background": {"pid", "up", "down_reason"}}}`` (pid 0: none now), each
        with ``entry_differs`` where it runs another entry than npud's (.host_entries); the
        main one with ``no_rt`` where npud adopted it and cannot grant its burst threads
        the FIFO its entry asks for (.hand_ties), and why."""
        out: dict[str, dict[str, Any]] = {}
        for slot in self.slots:
            leader = slot.leader or slot
            entry: dict[str, Any] = {"pid": _pid(leader) if slot.up else 0,
                                     **host_entries.summary(slot.entry_differs),
                                     **_no_rt(slot)}
            lane = slot.background
            if lane is not None:
                entry["background"] = {"pid": _pid(lane) if lane.up else 0, "up": lane.up,
                                       **({} if lane.up else
                                          {"down_reason": lane.last_exit or "starting"}),
                                       **host_entries.summary(lane.entry_differs)}
            out[slot.name] = entry
        return out


def _other_owes(slot: DriverSlot, grant_id: str) -> bool:
    """Whether the other host of ``slot``'s device still owes the end of ``grant_id``."""
    other = slot.main if slot.lane else slot.background
    return other is not None and grant_id in other.acks and other.up


def _no_rt(slot: DriverSlot) -> dict[str, Any]:
    """``{"no_rt": why}`` for an up host npud adopted without a tie (service/hand_ties.py)
    where the entry wants FIFO burst threads (``foreground_rt_priority``)."""
    leader = slot.leader or slot
    why = leader.adopted_record
    if (slot.up and leader.proc is None and leader.adopted_pid > 0 and isinstance(why, str)
            and why and int(slot.entry.get("foreground_rt_priority", 0) or 0)):
        return {"no_rt": why}
    return {}


def _pid(slot: DriverSlot) -> int:
    if slot.proc is not None:
        return slot.proc.pid
    if slot.adopted_pid > 0:
        return slot.adopted_pid
    return slot.conn.peer.pid if slot.conn is not None else 0


__all__ = ["HostLanes", "grant_class", "grant_target", "make_lane"]
