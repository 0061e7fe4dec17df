"""Events that change what a device may hold: the policy, a thermal status, a driver
coming up or going down, a model's real memory, a uid's importance.

Each changes one or more devices' budgets (:mod:`.budget`, via the
:class:`~.devices.DeviceTable`), then asks the state to rebalance those devices
only: shed the holders that no longer fit, re-sort the waiters, grant what fits.
Friends of :class:`~.state.ManagerState` (like :mod:`.adoption`): they use its
transitions rather than keep a second copy of them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from npumanager.constants import ThermalStatus, UnloadReason
from npumanager.errors import InvalidArgument
from npumanager.hal.types import SchedulingConfig
from npumanager.service import ending
from npumanager.service import policy as pol
from npumanager.service.events import (
    DriverDown,
    DriverUp,
    ImportanceChanged,
    ModelMemory,
    PolicySet,
    PushSchedulingConfigs,
    SetDriverThermal,
    ThermalChanged,
)
from npumanager.service.ranking import RequestState

if TYPE_CHECKING:
    from npumanager.service.state import ManagerState

_U = RequestState.UNLOAD_REQUESTED


def on_policy(s: ManagerState, ev: PolicySet) -> None:
    settings = pol.make_settings(
        ev.policy,
        max_budget=ev.max_budget,
        weights=ev.weights,
        memory_budget_bytes=ev.memory_budget_bytes,
        defaults=s.params.policy,
    )  # raises before anything changes
    s._settings = settings
    for dev in s._devices:
        budget = dev.budget
        budget.set_policy(settings)
        budget.reset_sums()
        for h in dev.holders.values():
            h.charge = budget.charge(h)
            budget.hold(h.charge)
            if h.state is _U:
                budget.unloading(h.charge)
        ending.recharge(s, dev)
    s._decide(None, "policy", **settings.as_dict())
    s._rebalance(list(s._devices), UnloadReason.POLICY_CHANGED)


def on_thermal(s: ManagerState, ev: ThermalChanged) -> None:
    status = ThermalStatus(ev.status)
    changed = s._devices.set_thermal(status, ev.device)  # raises on an unknown device
    s._emit(SetDriverThermal(status, changed[0][0].name if ev.device else ""))
    for dev, old in changed:
        s._decide(None, "thermal", device=dev.name, old=old.name,
                  new=dev.budget.thermal.name, cause=ev.device or "machine",
                  budget=dev.budget.grant_cap)
    s._rebalance([d for d, _ in changed], UnloadReason.THERMAL)


def on_driver_up(s: ManagerState, ev: DriverUp) -> None:
    reports = ev.devices or ((ev.name, ev.memory_bytes),)
    # Raises before changing anything; a device met for the first time starts in step
    # with the policy in force and the machine's thermal status.
    devs = s._devices.driver_up(ev.name, reports, s._settings)
    s._decide(None, "driver up", name=ev.name, devices=dict(reports))
    s._rebalance(devs, UnloadReason.MEMORY_PRESSURE)


def on_driver_down(s: ManagerState, ev: DriverDown) -> None:
    devs = s._devices.driver_down(ev.name)
    s._decide(None, "driver down", name=ev.name, devices=[d.name for d in devs])
    ending.driver_gone(s, devs)  # its process is gone, and the ended grants' models with it
    s._rebalance(devs, UnloadReason.MEMORY_PRESSURE)


def on_model_memory(s: ManagerState, ev: ModelMemory) -> None:
    if ev.nbytes < 0:
        raise InvalidArgument(f"model memory must be >= 0 bytes, got {ev.nbytes}")
    key = s._table.grants.get(ev.grant_id)
    if key is None:
        return  # the grant already ended
    req = s._table.requests[key]
    # One report per model prepared under the grant: a grant's models add up; a moved
    # grant's old copy, released, counts no more (the device's one budget holds it once).
    req.real_bytes = max(0, req.real_bytes - ev.nbytes) if ev.freed \
        else req.real_bytes + ev.nbytes
    budget = req.dev.budget
    old, req.charge = req.charge, budget.charge(req)
    budget.recharge(old, req.charge, unloading=req.state is _U)
    s._decide(key, "model freed" if ev.freed else "model memory", nbytes=ev.nbytes,
              charge=req.charge)
    if req.charge > old:
        s._enforce(req.dev, UnloadReason.MEMORY_PRESSURE)


def on_importance(s: ManagerState, ev: ImportanceChanged) -> None:
    """A uid's importance changed: its requests' ranks, the drivers' table, the thermal
    rank limit, then grants."""
    if isinstance(ev.importance, bool) or not isinstance(ev.importance, int):
        raise InvalidArgument(f"importance must be an integer, got {ev.importance!r}")
    if ev.importance < 0:
        raise InvalidArgument(f"importance must be >= 0, got {ev.importance}")
    if ev.uid == 0:
        s._decide(None, "importance ignored", uid=0, reason="uid 0 is fixed at foreground")
        return
    old_app = s.app_priority(ev.uid)
    old = s.importance(ev.uid)
    s._importance[ev.uid] = ev.importance
    s._decide(None, "importance", uid=ev.uid, old=old, new=ev.importance)
    for key in s._table.of_uid(ev.uid):
        req = s._table.requests[key]
        new_rank = ev.importance + int(req.priority)
        if new_rank == req.rank:
            continue
        if req.state.waits:
            req.dev.unplace(req)
            req.rank = new_rank
            req.dev.place(req)
        else:
            req.rank = new_rank
    new_app = s.app_priority(ev.uid)
    if new_app != old_app:
        s._emit(PushSchedulingConfigs((SchedulingConfig(uid=ev.uid, app_priority=new_app),)))
    for dev in s._devices:
        s._enforce(dev, UnloadReason.THERMAL)  # the capacity is unchanged: the rank limit
        s._pump(dev)
