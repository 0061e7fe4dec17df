"""npud's inputs besides its clients: the thermal monitor, the Linux importance
provider and the ``[[app]]`` table, each wired in when its config asks for it.

What each feeds the state:

* ``npumanager.thermal.monitor.ThermalMonitor(section, clock, driver_temps)``:
  polled every ``[thermal] poll_interval_s``; a changed status becomes
  ``ThermalChanged``. ``npu thermal override|reset`` go through it.
* ``npumanager.service.importance.ProcessImportance(section)`` with
  ``[importance] from_process = true``: a client's importance is derived from
  its process when its uid first asks, and re-checked every
  ``recheck_interval_s``; a change becomes ``ImportanceChanged``.
* ``npumanager.service.apps.AppTable.from_config(cfg)``: the ``[[app]]``
  entries' importances become ``ImportanceChanged`` at start, their
  scheduling table goes to the drivers (``set_scheduling_configs``), the
  single-entry updates the state pushes keep each app's configured
  min/max/direct-access/attribution, and under ``[importance] identity =
  "unit"`` a client is keyed by its systemd unit instead of its uid.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from npumanager.constants import ThermalStatus
from npumanager.errors import InvalidArgument, NpuError
from npumanager.hal.types import SchedulingConfig
from npumanager.service import events as ev
from npumanager.service.apps import AppEntry, AppTable
from npumanager.service.importance import ProcessImportance, unused_rules
from npumanager.service.policy import ROOT_IMPORTANCE
from npumanager.thermal.monitor import ThermalMonitor

if TYPE_CHECKING:
    from npumanager.service.daemon import Daemon, ManagerClient

log = logging.getLogger("npumanager.npud")


class Integrations:
    def __init__(self, daemon: Daemon) -> None:
        self.d = daemon
        self.thermal: ThermalMonitor | None = None
        self.importance: ProcessImportance | None = None
        self.apps: AppTable | None = None
        self.unit_identity = False
        self.status = ThermalStatus.NONE
        #: Each device's own status ([thermal] devices), as last fed to the state.
        self.device_status: dict[str, ThermalStatus] = {}
        self._override: ThermalStatus | None = None
        self._app_by_key: dict[int, AppEntry] = {}
        self._importance_of: dict[int, int] = {}
        #: Keys whose importance an admin set: the process provider never overrides them
        #: (precedence: admin API, then [[app]], then the process).
        self._admin_keys: set[int] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def wired(self) -> dict[str, bool]:
        return {"thermal_monitor": self.thermal is not None,
                "process_importance": self.importance is not None,
                "app_table": self.apps is not None, "unit_identity": self.unit_identity}

    # --- start / stop -------------------------------------------------------

    def check(self) -> None:
        """What :meth:`setup` would refuse in the config, said before npud starts its
        driver hosts: a bad ``[[app]]`` entry or ``[thermal] devices`` name stopped npud
        only once its hosts were up, and left them orphaned for ``orphan_grace_s``."""
        cfg = self.d.cfg
        imp_section = cfg.section("importance")
        if cfg.apps() or imp_section.get("identity") == "unit":
            AppTable.from_config(cfg)
        if imp_section.get("from_process"):
            ProcessImportance(imp_section)
        monitor = ThermalMonitor(cfg.section("thermal"), self.d.clock, dict, sources=[])
        known = [x.name for x in self.d.drivers.devices()]
        unknown = [n for n in monitor.device_thermal.devices if n not in known]
        if known and unknown:
            raise InvalidArgument(f"[thermal] devices names {', '.join(unknown)}; npud's "
                                  f"devices are {', '.join(known)}")

    def setup(self) -> None:
        cfg = self.d.cfg
        imp_section = cfg.section("importance")
        if cfg.apps() or imp_section.get("identity") == "unit":
            self.apps = AppTable.from_config(cfg)
            self.unit_identity = self.apps.identity_mode == "unit"
            self._app_by_key = {e.key: e for e in self.apps.entries}
            self.d.drivers.set_scheduling_configs(list(self.apps.scheduling_table()))
            for key, importance in self.apps.importances().items():
                self._feed_importance(key, importance, "app-config")
        # npud ranks root's requests as foreground (ManagerState.importance): the drivers
        # must run root's work the same way. Without an entry root was an unknown uid to
        # them (priority 1000: BACKGROUND class, lowered threads, compiled off-process).
        if self.apps is None or all(c.uid != 0 for c in self.apps.scheduling_table()):
            self.d.drivers.update_scheduling_configs(
                [SchedulingConfig(uid=0, app_priority=ROOT_IMPORTANCE)])
        section = cfg.section("thermal")
        self.thermal = ThermalMonitor(section, self.d.clock, self.d.drivers.temperatures)
        known = [x.name for x in self.d.drivers.devices()]
        unknown = [n for n in self.thermal.device_thermal.devices if n not in known]
        if known and unknown:
            raise InvalidArgument(f"[thermal] devices names {', '.join(unknown)}; npud's "
                                  f"devices are {', '.join(known)}")
        self._spawn(self._poll_thermal(float(section.get("poll_interval_s", 1.0))))
        unused = unused_rules((cfg.user or {}).get("importance") or {},
                              bool(imp_section.get("from_process")))
        if unused:
            log.warning("%s", unused)
        if imp_section.get("from_process"):
            self.importance = ProcessImportance(imp_section)
            self._spawn(self._recheck_importance(
                float(imp_section.get("recheck_interval_s", 2.0))))
        log.info("optional components: %s", ", ".join(
            f"{name.replace('_', ' ').replace('app table', '[[app]] table')} "
            f"{'on' if on else 'off'}" for name, on in self.wired().items()))

    def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self.thermal is not None:
            try:
                self.thermal.close()
            except Exception:
                log.exception("closing the thermal monitor failed")

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- identity and scheduling table ----------------------------------

    def identity(self, uid: int, pid: int) -> int:
        """The key npud uses for a client: its uid, or its systemd unit's app key."""
        if not self.unit_identity or pid <= 0 or self.apps is None:
            return uid
        try:
            return self.apps.identity(uid, pid)
        except Exception:
            log.exception("app identity of pid %d failed; using uid %d", pid, uid)
            return uid

    def merge_configs(self, entries: tuple[SchedulingConfig, ...]) -> list[SchedulingConfig]:
        """The state's importance-driven updates, keeping each app's configured limits."""
        if not self._app_by_key:
            return list(entries)
        out = []
        for e in entries:
            app = self._app_by_key.get(e.uid)
            out.append(e if app is None else app.scheduling_config(e.uid, e.app_priority))
        return out

    # --- importance --------------------------------------------------------

    def _feed_importance(self, key: int, importance: int, kind: str) -> None:
        self._importance_of[key] = importance
        self.d.submit_quietly(ev.ImportanceChanged(
            stimulus_id=self.d.stimulus(kind), now=self.d.clock.now(), uid=key,
            importance=importance))

    def admin_set(self, key: int) -> None:
        """An admin set this key's importance (set_uid_importance); it now wins."""
        self._admin_keys.add(key)

    def client_seen(self, client: ManagerClient) -> None:
        """A connection's first request: derive its importance from its process if asked."""
        if self.importance is None:
            return
        key = client.key
        if key in self._importance_of or key in self._app_by_key or key in self._admin_keys:
            return
        pid = client.conn.peer.pid
        try:
            imp = self.importance.importance_of(pid)
        except Exception:
            log.exception("importance provider failed for pid %d", pid)
            return
        if imp is not None:
            self._feed_importance(key, int(imp), "importance")

    def client_gone(self, key: int) -> None:
        if key not in self._app_by_key:
            self._importance_of.pop(key, None)

    def recheck_importance_once(self) -> None:
        if self.importance is None:
            return
        fresh: dict[int, int] = {}
        for client in list(self.d.clients.values()):
            key, pid = client.key, client.conn.peer.pid
            if (key in fresh or key in self._app_by_key or key in self._admin_keys
                    or pid <= 0):
                continue
            try:
                imp = self.importance.importance_of(pid)
            except Exception:
                log.exception("importance provider failed for pid %d", pid)
                continue
            if imp is not None:
                fresh[key] = int(imp)
        for key, imp in fresh.items():
            if self._importance_of.get(key) != imp:
                self._feed_importance(key, imp, "importance")

    async def _recheck_importance(self, interval: float) -> None:
        while True:
            await self.d.clock.sleep(interval)
            self.recheck_importance_once()

    # --- thermal -----------------------------------------------------------

    def thermal_changed(self, status: ThermalStatus, why: str) -> None:
        if status == self.status:
            return
        # The monitor logs each change with its cause (the sensor and reading); log here
        # only when there is no monitor, so a change is not logged twice.
        log.log(logging.DEBUG if self.thermal is not None else logging.INFO,
                "thermal status %s -> %s (%s)", self.status.name, status.name, why,
                extra={"thermal": status.name})
        self.status = status
        self.d.submit_quietly(ev.ThermalChanged(stimulus_id=self.d.stimulus("thermal"),
                                                now=self.d.clock.now(), status=status))

    def poll_thermal_once(self) -> None:
        if self.thermal is None:
            return
        try:
            status = ThermalStatus(self.thermal.poll())
        except Exception:
            log.exception("thermal poll failed")
            return
        self.thermal_changed(status, "sensors")
        for device, own in self.thermal.device_status.items():
            if own != self.device_status.get(device, ThermalStatus.NONE):
                # That device's own status: only its budget follows it.
                log.log(logging.WARNING if own > self.device_status.get(
                    device, ThermalStatus.NONE) else logging.INFO,
                    "thermal status of %s -> %s (its own sensor)", device, own.name,
                    extra={"thermal": own.name})
                self.device_status[device] = own
                self.d.submit_quietly(ev.ThermalChanged(
                    stimulus_id=self.d.stimulus("thermal"), now=self.d.clock.now(),
                    status=own, device=device))

    async def _poll_thermal(self, interval: float) -> None:
        while True:
            self.poll_thermal_once()
            await self.d.clock.sleep(interval)

    def thermal_override(self, status: ThermalStatus | None) -> None:
        why = "admin override" if status is not None else "override reset"
        self._override = status
        if self.thermal is not None:
            self.thermal.override(status)
            try:
                polled = ThermalStatus(self.thermal.poll())
            except NpuError:
                raise
            except Exception:
                log.exception("thermal poll failed")
                polled = status if status is not None else self.status
            self.thermal_changed(polled, why)
        else:  # no monitor in this build: the override is the only source
            self.thermal_changed(status if status is not None else ThermalStatus.NONE, why)

    def thermal_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"status": self.status.name,
                                "overridden": self._override is not None, "headroom": None}
        if self.thermal is not None:
            try:
                info.update(self.thermal.describe())
                info["headroom"] = float(self.thermal.headroom())
            except Exception:
                log.exception("thermal describe failed")
        info["status"] = self.status.name
        info["temperatures"] = self.d.drivers.temperatures()
        return info
