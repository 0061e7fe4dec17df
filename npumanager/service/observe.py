"""Observers of npud: what metrics, systemd notify and traces see, without touching the
pure :class:`ManagerState`.

The daemon calls each observer on its event loop after it has carried out an
event's instructions (so an observer sees exactly what npud decided and did),
and for what drivers report that is no state event (work started, cache
results). Observers must be quick and must not raise: a failing one is logged
and npud goes on.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from npumanager.hal.types import EndReason, WorkInfo
    from npumanager.service.daemon import Daemon
    from npumanager.service.events import Event, Instruction


class DaemonObserver:
    """Base class: every hook does nothing."""

    def attach(self, daemon: Daemon) -> None:
        """Called once, before npud starts serving."""

    def on_event(self, event: Event, instructions: list[Instruction]) -> None:
        """An event the state handled and the instructions npud carried out for it."""

    def on_request_refused(self, reason: str) -> None:
        """A load request refused before any decision (no status, no event): ``malformed``,
        ``invalid``, ``over_limit`` or ``error``."""

    def on_work_started(self, driver: str, info: WorkInfo) -> None:
        """HAL on_work_started (a uid's burst of work began on ``driver``)."""

    def on_work_ended(self, driver: str, info: WorkInfo, reason: EndReason) -> None:
        """HAL on_work_ended."""

    def on_driver(self, name: str, up: bool, reason: str) -> None:
        """A driver came up (``reason`` "") or went down (with why)."""

    def on_cache_result(self, driver: str, result: str) -> None:
        """A prepare from the compilation cache: ``hit``, ``miss`` or ``rejected``."""

    def on_ready(self, daemon: Daemon) -> None:
        """Clients can connect."""

    def on_stopping(self, reason: str) -> None:
        """npud begins to shut down."""

    def close(self) -> None:
        """npud has stopped: release what the observer holds (sockets, servers)."""


def call(observers: list[Any], hook: str, *args: Any) -> None:
    """Call ``hook`` on each observer; a failing observer is logged, never fatal."""
    import logging

    for o in observers:
        try:
            getattr(o, hook)(*args)
        except Exception:
            logging.getLogger("npumanager.npud").exception("observer %r failed in %s", o, hook)
