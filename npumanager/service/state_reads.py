"""ManagerState's public reads: the settings, budgets, thermal status, importances,
live grants and decision stories npud's RPCs and metrics ask for (a mixin of it, split
out of state.py by topic; pure, like it: nothing here changes the state).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from npumanager.constants import ThermalStatus
from npumanager.hal.types import SchedulingConfig
from npumanager.service import policy as pol
from npumanager.service.events import Decision
from npumanager.service.ranking import RequestState

if TYPE_CHECKING:
    from npumanager.service.decisions import DecisionLog
    from npumanager.service.devices import DeviceTable
    from npumanager.service.policy import ManagerParams, PolicySettings
    from npumanager.service.table import RequestTable


class StateReads:
    """What ManagerState answers without changing."""

    if TYPE_CHECKING:  # ManagerState's, declared for the type checker
        params: ManagerParams
        _settings: PolicySettings
        _devices: DeviceTable
        _table: RequestTable
        _importance: dict[int, int]
        _log: DecisionLog

    @property
    def settings(self) -> PolicySettings:
        return self._settings

    @property
    def thermal_status(self) -> ThermalStatus:
        """The machine's thermal status (a device may be hotter: :meth:`device_thermal`)."""
        return self._devices.thermal

    @property
    def budget_used(self) -> int:
        """What the first device's holders hold (:meth:`used_on` for another)."""
        return self._devices.first.budget.used

    @property
    def budget_total(self) -> int | None:
        """The first device's budget for new grants (thermally scaled); None = unlimited."""
        return self._devices.first.budget.grant_cap

    def devices(self) -> list[str]:
        """Every device's name, in order (the first takes requests that name none)."""
        return list(self._devices.by_name)

    def used_on(self, device: str) -> int:
        return self._devices.get(device).budget.used

    def total_on(self, device: str) -> int | None:
        """``device``'s budget for new grants (thermally scaled); None = unlimited."""
        return self._devices.get(device).budget.grant_cap

    def device_thermal(self, device: str) -> ThermalStatus:
        """The thermal status ``device``'s budget follows (the worse of the machine's and
        its own)."""
        return self._devices.get(device).budget.thermal

    def device_of(self, uid: int, request_id: int) -> str | None:
        req = self._table.requests.get((uid, request_id))
        return None if req is None else req.dev.name

    def importance(self, uid: int) -> int:
        if uid == 0:
            return pol.ROOT_IMPORTANCE
        return self._importance.get(uid, self.params.default_importance)

    def app_priority(self, uid: int) -> int:
        return max(0, min(1000, self.importance(uid)))

    def request_state(self, uid: int, request_id: int) -> RequestState | None:
        req = self._table.requests.get((uid, request_id))
        return None if req is None else req.state

    def live_grants(self) -> list[tuple[str, int, int]]:
        """(grant_id, uid, request_id) of every live grant: re-issue them to a restarted driver."""
        return [(g, k[0], k[1]) for g, k in self._table.grants.items()]

    def grant_devices(self) -> dict[str, str]:
        """grant id -> the device it is valid for, of every live grant."""
        reqs = self._table.requests
        return {g: reqs[k].dev.name for g, k in self._table.grants.items()}

    def scheduling_table(self) -> list[SchedulingConfig]:
        """The full table for a (re)connecting driver: every uid whose importance was set."""
        return [
            SchedulingConfig(uid=u, app_priority=self.app_priority(u)) for u in self._importance
        ]

    def story(self, uid: int, request_id: int) -> list[Decision]:
        return self._log.story((uid, request_id))

    def decisions_since(self, t: float, limit: int) -> tuple[list[Decision], bool]:
        return self._log.since(t, limit)

    def decisions(self) -> list[Decision]:
        return self._log.all()
