"""The seam between npud's core and its driver supervisor.

The daemon talks to drivers only through :class:`DriverControl`; the
supervisor reports back only through :class:`DriverEvents`. This keeps the
manager testable without any driver (:class:`NoDrivers`) and the supervisor
testable without the manager. :func:`event_handlers` turns what a driver pushes into
those events.
"""

from __future__ import annotations

from typing import Protocol

from npumanager.constants import ThermalStatus
from npumanager.fds import close_fds
from npumanager.hal.types import EndReason, SchedulingConfig, WorkInfo
from npumanager.hal.wire import work_event_from_payload
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.proto.v1.common_pb2 import DeviceInfo
from npumanager.wire.conn import CallContext


class DriverEvents(Protocol):
    """What the supervisor tells the daemon (called on the daemon's event loop)."""

    def driver_up(self, info: DeviceInfo) -> None: ...
    def driver_down(self, name: str, reason: str) -> None: ...
    def work_ended(self, driver: str, info: WorkInfo, reason: EndReason) -> None: ...
    def model_memory(self, driver: str, grant_id: str, nbytes: int) -> None: ...
    def grant_end_applied(self, driver: str, grant_id: str) -> None: ...


class DriverControl(Protocol):
    """What the daemon tells its drivers. Every method is non-blocking."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def detach(self) -> None:
        """Let go of the drivers without stopping them or ending their grants (a restart:
        each keeps its loaded models for its orphan grace, for the next npud to adopt)."""
        ...
    def devices(self) -> list[DeviceInfo]: ...
    def set_scheduling_configs(self, table: list[SchedulingConfig]) -> None:
        """The full table; the supervisor also re-pushes the last one on every (re)connect."""
        ...
    def update_scheduling_configs(self, entries: list[SchedulingConfig]) -> None: ...
    def grant_issued(self, uid: int, request_id: int, grant_id: str, device: str = "",
                     priority: int = 0) -> None:
        """A grant valid on ``device`` only (its driver alone is told; "": every driver);
        ``priority``, the request's ModelPriority, picks the device's host where it has
        a background lane (service/host_lanes.py)."""
        ...
    def grant_ended(self, grant_id: str, revoked: bool, *, ack: bool = False) -> None:
        """``ack``: the driver reports ``grant_end_applied`` once it released the models."""
        ...
    def restart(self, driver: str, reason: str) -> None:
        """Kill driver ``driver`` (hung: ``reason``); it is restarted as after a crash."""
        ...
    def set_thermal_status(self, status: ThermalStatus, device: str = "") -> None:
        """The machine's thermal status (``device`` "") or one device's own."""
        ...
    def temperatures(self) -> dict[str, float]:
        """Latest temperature (Celsius) each driver's own thermal model reported."""
        ...


class NoDrivers:
    """A DriverControl with no drivers: npud runs as a pure manager."""

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def detach(self) -> None:
        pass

    def devices(self) -> list[DeviceInfo]:
        return []

    def set_scheduling_configs(self, table: list[SchedulingConfig]) -> None:
        pass

    def update_scheduling_configs(self, entries: list[SchedulingConfig]) -> None:
        pass

    def grant_issued(self, uid: int, request_id: int, grant_id: str, device: str = "",
                     priority: int = 0) -> None:
        pass

    def grant_ended(self, grant_id: str, revoked: bool, *, ack: bool = False) -> None:
        pass

    def restart(self, driver: str, reason: str) -> None:
        pass

    def set_thermal_status(self, status: ThermalStatus, device: str = "") -> None:
        pass

    def temperatures(self) -> dict[str, float]:
        return {}


def event_handlers(name: str, events: DriverEvents) -> dict[str, object]:
    """The handlers of what driver ``name`` pushes to npud, reported to ``events``."""

    def on_ended(ctx: CallContext, payload: bytes) -> None:
        close_fds(ctx.fds)
        info, reason = work_event_from_payload(payload)
        events.work_ended(name, info, EndReason(reason))

    def ignore(ctx: CallContext, payload: bytes) -> None:
        close_fds(ctx.fds)

    # Optional DriverEvents hooks (npud's observers: metrics, traces).
    started_hook = getattr(events, "work_started", None)
    cache_hook = getattr(events, "cache_result", None)

    def on_started(ctx: CallContext, payload: bytes) -> None:
        close_fds(ctx.fds)
        if started_hook is not None:
            info, _reason = work_event_from_payload(payload)
            started_hook(name, info)

    def on_cache(ctx: CallContext, payload: bytes) -> None:
        close_fds(ctx.fds)
        result = bytes(payload[:16]).decode("ascii", "replace")
        if cache_hook is not None and result in ("hit", "miss", "rejected", "fleet"):
            cache_hook(name, result)

    def on_end_applied(ctx: CallContext, payload: bytes) -> None:
        close_fds(ctx.fds)
        events.grant_end_applied(name, pb.GrantEnded.FromString(payload).grant_id)

    def on_memory(ctx: CallContext, payload: bytes) -> None:
        close_fds(ctx.fds)
        msg = pb.ModelMemory.FromString(payload)
        if msg.freed:  # a moved grant's old copy, released (service/grant_moves.py)
            freed = getattr(events, "model_freed", None)
            if freed is not None:
                freed(name, msg.grant_id, msg.nbytes)
            return
        events.model_memory(name, msg.grant_id, msg.nbytes)

    return {"hal.on_work_requested": ignore, "hal.on_work_started": on_started,
            "hal.on_work_ended": on_ended, "hal.model_memory": on_memory,
            "hal.cache_result": on_cache, "hal.grant_end_applied": on_end_applied,
            "goodbye": ignore}
