"""One device's budget: what holders are charged against it and what new grants may use.

:class:`Budget` owns the policy settings in force, the running sums of the
holders' charges on its device, and the capacity that follows from the policy,
the device's memory (MEMORY), its own ceilings (:class:`~.policy.DeviceLimits`)
and its thermal status — the thermal governor's arithmetic: the budget scale per
status, the keep-rank above which holders must leave, and whether OPPORTUNISTIC
requests wait. It decides nothing about requests;
:class:`~npumanager.service.state.ManagerState` asks it whether a charge fits
and whether a request is eligible at all. npud has one per device
(:mod:`.devices`).

Two capacities, because a device whose driver is down keeps its holders' grants
while the driver restarts: new grants must fit ``grant_cap`` (its memory counts
only while up), while the invariant on what is held (``hold_cap``) still counts
the memory of a device that is down.
"""

from __future__ import annotations

from typing import Any

from npumanager.constants import ModelPriority, Policy, ThermalStatus
from npumanager.service import policy as pol
from npumanager.service.policy import DeviceLimits, ManagerParams, PolicySettings
from npumanager.service.ranking import ManagedRequest

_OPP = ModelPriority.OPPORTUNISTIC


class Budget:
    __slots__ = ("freeing", "grant_cap", "hold_cap", "keep", "limits", "memory_bytes", "params",
                 "settings", "thermal", "up", "used")

    def __init__(self, params: ManagerParams, limits: DeviceLimits | None = None) -> None:
        self.params = params
        self.settings: PolicySettings = params.policy
        self.limits = limits
        self.thermal = ThermalStatus.NONE  # in effect here: max(global, the device's own)
        self.memory_bytes = 0  # what the device's driver reported
        self.up = False  # its driver is up: its memory counts for new grants
        self.used = 0  # charges of every holder
        self.freeing = 0  # charges of holders asked to unload
        self.grant_cap: int | None = None  # what new grants must fit in; None = unlimited
        self.hold_cap: int | None = None  # what holders not unloading may hold
        self.keep: int | None = None  # the thermal keep-rank; None = everyone may hold
        self.refresh()

    def __repr__(self) -> str:
        return f"<Budget {self.describe()}>"

    def describe(self) -> str:
        """``3/4 used`` (``1.5/8.0 GiB used`` under MEMORY), and the thermal status if any."""
        cap = "unlimited" if self.grant_cap is None else str(self.grant_cap)
        if self.settings.policy is Policy.MEMORY:
            gib = float(pol.GIB)
            used = f"{self.used / gib:.1f}"
            cap = "unlimited" if self.grant_cap is None else f"{self.grant_cap / gib:.1f} GiB"
        else:
            used = str(self.used)
        thermal = "" if self.thermal == ThermalStatus.NONE else f" thermal={self.thermal.name}"
        return f"{used}/{cap} used{thermal}"

    # --- what things cost and what fits --------------------------------------------

    def charge(self, req: ManagedRequest) -> int:
        """What ``req`` counts against the budget under the policy in force."""
        return pol.charge(self.settings, req.size, req.real_bytes, self.params.size_bytes)

    def fits(self, charge: int) -> bool:
        return self.grant_cap is None or self.used + charge <= self.grant_cap

    def eligible(self, req: ManagedRequest, charge: int | None = None) -> bool:
        """Whether ``req`` may be granted at all under the thermal status and the budget.

        ``charge``: the request's charge when the caller has it already."""
        keep = self.keep
        if keep is not None and req.rank > keep:
            return False
        if req.priority == _OPP and self.thermal >= self.params.opportunistic_wait_from:
            return False
        cap = self.grant_cap
        if cap is None:
            return True
        return (self.charge(req) if charge is None else charge) <= cap

    def over_hold_cap(self) -> bool:
        """Holders not asked to unload hold more than the budget allows."""
        return self.hold_cap is not None and self.used - self.freeing > self.hold_cap

    @property
    def thermal_scale(self) -> float:
        return self.params.thermal_budget_scale.get(
            self.thermal, pol.DEFAULT_THERMAL_SCALE[self.thermal])

    # --- the running sums ---------------------------------------------------------

    def hold(self, charge: int) -> None:
        self.used += charge

    def unloading(self, charge: int) -> None:
        """A holder was asked to unload: what it holds will be freed."""
        self.freeing += charge

    def release(self, charge: int, *, unloading: bool) -> None:
        self.used -= charge
        if unloading:
            self.freeing -= charge

    def recharge(self, old: int, new: int, *, unloading: bool) -> None:
        """A holder's charge changed (a driver reported its real memory)."""
        self.used += new - old
        if unloading:
            self.freeing += new - old

    def reset_sums(self) -> None:
        """Before re-charging every holder under new settings."""
        self.used = self.freeing = 0

    # --- what changes the capacity ------------------------------------------------

    def set_policy(self, settings: PolicySettings) -> None:
        self.settings = settings
        self.refresh()

    def set_thermal(self, status: ThermalStatus) -> ThermalStatus:
        """Returns the status it replaced."""
        old, self.thermal = self.thermal, status
        self.refresh()
        return old

    def device_up(self, memory_bytes: int) -> None:
        self.memory_bytes = memory_bytes
        self.up = True
        self.refresh()

    def device_down(self) -> None:
        self.up = False
        self.refresh()

    @property
    def total(self) -> int | None:
        """The unscaled budget (what the device would allow at thermal NONE)."""
        return pol.base_budget(self.settings, self.memory_bytes if self.up else 0, self.limits)

    def refresh(self) -> None:
        scale = self.thermal_scale
        in_bytes = self.settings.policy is Policy.MEMORY
        live = self.memory_bytes if self.up else 0
        self.grant_cap = pol.scale_budget(pol.base_budget(self.settings, live, self.limits),
                                          scale, in_bytes=in_bytes)
        self.hold_cap = pol.scale_budget(
            pol.base_budget(self.settings, self.memory_bytes, self.limits), scale,
            in_bytes=in_bytes)
        self.keep = pol.keep_rank(self.params.thermal_keep_rank, self.thermal)

    # --- for npu status -----------------------------------------------------------

    def dump(self) -> dict[str, Any]:
        """This device's ``budget`` and ``thermal`` sections of npud's dump."""
        return {
            "budget": {
                "used": self.used,
                "unloading": self.freeing,
                "total": self.total,
                "thermal_scaled": self.grant_cap,
            },
            "thermal": {
                "status": self.thermal.name,
                "budget_scale": self.thermal_scale,
                "keep_rank": self.keep,
                "opportunistic_wait": self.thermal >= self.params.opportunistic_wait_from,
            },
        }
