"""The thermal governor inside ManagerState, driven with ThermalChanged on a virtual clock.

Each test names the governor action it pins (ARCHITECTURE "Thermal"): budget
scaling; from MODERATE new OPPORTUNISTIC requests wait; from SEVERE holders
ranked above PERCEPTIBLE are asked to unload with THERMAL, opportunistic
first; CRITICAL keeps ranks up to FOREGROUND_SERVICE, EMERGENCY only
FOREGROUND, SHUTDOWN nothing; falling status lets waiters back in; a holder
that ignores the thermal unload is revoked at the deadline. The last test
heats a fake sysfs zone and feeds what ThermalMonitor says into the state.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from npumanager.config import Config
from npumanager.constants import (
    Importance,
    LoadStatus,
    ModelPriority,
    ModelSize,
    Policy,
    RequestStatus,
    ThermalStatus,
    UnloadReason,
)
from npumanager.service import events as ev
from npumanager.service.policy import ManagerParams
from npumanager.service.state import ManagerState
from npumanager.testing import VirtualClock
from npumanager.testing.fake_sysfs import FakeSysfs
from npumanager.thermal.monitor import ThermalMonitor

T = ThermalStatus
FG, FGS, VIS, PER, SVC, CACHED = 1001, 1002, 1003, 1004, 1005, 1006
IMPORTANCE = {
    FG: Importance.FOREGROUND,
    FGS: Importance.FOREGROUND_SERVICE,
    VIS: Importance.VISIBLE,
    PER: Importance.PERCEPTIBLE,
    SVC: Importance.SERVICE,
    CACHED: Importance.CACHED,
}


class Gov:
    """ManagerState on a virtual clock: events in, instructions out, timers fired on time."""

    def __init__(self, policy: Policy = Policy.STATUS_QUO, **policy_kw: Any) -> None:
        self.clock = VirtualClock()
        params = ManagerParams().with_policy(int(policy), **policy_kw)
        self.state = ManagerState(params)
        self.timers: dict[str, float] = {}
        self._ids = itertools.count()
        self.out: list[ev.Instruction] = []
        if policy is Policy.MEMORY:
            self.handle(ev.DriverUp, name="reference", memory_bytes=64 << 30)
        for uid, imp in IMPORTANCE.items():
            self.handle(ev.ImportanceChanged, uid=uid, importance=int(imp))

    def handle(self, cls: type[ev.Event], **kw: Any) -> list[ev.Instruction]:
        event = cls(stimulus_id=f"t{next(self._ids)}", now=self.clock.now(), **kw)
        out = self.state.handle(event)
        for ins in out:
            if isinstance(ins, ev.ArmTimer):
                self.timers[ins.key] = ins.at
            elif isinstance(ins, ev.CancelTimer):
                self.timers.pop(ins.key, None)
        self.state.validate()
        self.out = out
        return out

    def advance(self, seconds: float) -> list[ev.Instruction]:
        """Move time on, firing every timer that comes due; all their instructions."""
        self.clock.advance(seconds)
        fired: list[ev.Instruction] = []
        for key, at in sorted(self.timers.items(), key=lambda kv: kv[1]):
            if at <= self.clock.now() and self.timers.get(key) == at:
                del self.timers[key]
                fired += self.handle(ev.TimerFired, key=key)
        return fired

    def request(
        self,
        uid: int,
        rid: int,
        priority: ModelPriority = ModelPriority.NORMAL,
        size: ModelSize = ModelSize.LESS_THAN_1GB,
    ) -> LoadStatus | None:
        out = self.handle(
            ev.RequestLoad, uid=uid, pid=uid, conn=uid, request_id=rid, size=size, priority=priority
        )
        statuses = [i.status for i in out if isinstance(i, ev.SendCanLoad) and i.uid == uid]
        return statuses[-1] if statuses else None

    def hold(self, uid: int, rid: int, priority: ModelPriority = ModelPriority.NORMAL) -> None:
        assert self.request(uid, rid, priority) == LoadStatus.CAN_LOAD_NOW, (uid, rid)
        self.handle(ev.ModelLoaded, uid=uid, conn=uid, request_id=rid)

    def thermal(self, status: ThermalStatus) -> list[ev.Instruction]:
        return self.handle(ev.ThermalChanged, status=status)

    def state_of(self, uid: int, rid: int) -> str | None:
        s = self.state.request_state(uid, rid)
        return None if s is None else s.value


def asks(out: list[ev.Instruction]) -> list[tuple[int, int, UnloadReason]]:
    return [(i.uid, i.request_id, i.reason) for i in out if isinstance(i, ev.AskUnload)]


def granted(out: list[ev.Instruction]) -> list[tuple[int, int]]:
    return [
        (i.uid, i.request_id)
        for i in out
        if isinstance(i, ev.SendCanLoad) and i.status == LoadStatus.CAN_LOAD_NOW
    ]


def everyone(g: Gov) -> None:
    """One NORMAL model per importance level, plus background and opportunistic models."""
    for uid in IMPORTANCE:
        g.hold(uid, 1)
    g.hold(FG, 2, ModelPriority.BACKGROUND)  # rank 1100
    g.hold(FG, 3, ModelPriority.OPPORTUNISTIC)  # rank 2100


POLICIES = [
    pytest.param(Policy.STATUS_QUO, {}, id="status_quo"),
    pytest.param(Policy.BUDGET, {"max_budget": 100}, id="budget"),
    pytest.param(Policy.MEMORY, {}, id="memory"),
]


# --- budget scaling ------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "budget"),
    [
        (T.NONE, 4),
        (T.LIGHT, 4),
        (T.MODERATE, 3),
        (T.SEVERE, 2),
        (T.CRITICAL, 1),
        (T.EMERGENCY, 1),
        (T.SHUTDOWN, 0),
    ],
)
def test_budget_scales_with_status(status: ThermalStatus, budget: int) -> None:
    g = Gov(Policy.BUDGET)
    assert g.state.budget_total == 4
    g.thermal(status)
    assert g.state.budget_total == budget
    g.thermal(T.NONE)
    assert g.state.budget_total == 4


def test_shrunk_budget_asks_the_worst_holders_to_unload_with_thermal() -> None:
    g = Gov(Policy.BUDGET)
    for uid in (FG, FGS, VIS, PER):  # four small models: budget 4 full, all ranks kept
        g.hold(uid, 1)
    out = g.thermal(T.MODERATE)  # budget 3
    assert asks(out) == [(PER, 1, UnloadReason.THERMAL)]
    out = g.thermal(T.SEVERE)  # budget 2
    assert asks(out) == [(VIS, 1, UnloadReason.THERMAL)]
    assert g.state_of(FG, 1) == g.state_of(FGS, 1) == "loaded"
    # Those asked report unloaded; a new foreground request must fit the scaled budget.
    g.handle(ev.ModelUnloaded, uid=PER, conn=PER, request_id=1)
    g.handle(ev.ModelUnloaded, uid=VIS, conn=VIS, request_id=1)
    # 2/2 used by FG and FGS; FGS may not preempt the more important FG.
    assert g.request(FGS, 9) == LoadStatus.NOT_PRIORITIZED
    out = g.thermal(T.NONE)
    assert granted(out) == [(FGS, 9)]


def test_driver_is_told_every_status_change() -> None:
    g = Gov(Policy.BUDGET)
    for status in (T.LIGHT, T.CRITICAL, T.NONE):
        out = g.thermal(status)
        assert ev.SetDriverThermal(status) in out


# --- opportunistic waits from MODERATE --------------------------------------------


@pytest.mark.parametrize(("policy", "kw"), POLICIES)
def test_opportunistic_requests_wait_from_moderate(policy: Policy, kw: dict[str, Any]) -> None:
    g = Gov(policy, **kw)
    g.thermal(T.LIGHT)
    assert g.request(FG, 1, ModelPriority.OPPORTUNISTIC) == LoadStatus.CAN_LOAD_NOW
    g.thermal(T.MODERATE)
    assert g.request(FG, 2, ModelPriority.OPPORTUNISTIC) == LoadStatus.NOT_PRIORITIZED
    assert g.request(CACHED, 3) == LoadStatus.CAN_LOAD_NOW  # NORMAL still loads at MODERATE
    assert g.state_of(FG, 1) == "granted"  # an opportunistic holder is not evicted yet
    out = g.thermal(T.LIGHT)  # falling status lets the waiter back in
    assert granted(out) == [(FG, 2)]


# --- rank cut-offs per status --------------------------------------------------------


@pytest.mark.parametrize(("policy", "kw"), POLICIES)
def test_severe_unloads_ranks_above_perceptible_opportunistic_first(
    policy: Policy, kw: dict[str, Any]
) -> None:
    g = Gov(policy, **kw)
    everyone(g)
    out = g.thermal(T.SEVERE)
    got = asks(out)
    assert got[0] == (FG, 3, UnloadReason.THERMAL)  # the opportunistic model goes first
    assert got[1] == (FG, 2, UnloadReason.THERMAL)  # then the background one (rank 1100)
    assert sorted(got) == sorted(
        [
            (FG, 3, UnloadReason.THERMAL),
            (FG, 2, UnloadReason.THERMAL),
            (CACHED, 1, UnloadReason.THERMAL),
            (SVC, 1, UnloadReason.THERMAL),
        ]
    )
    assert got[2:] == [(CACHED, 1, UnloadReason.THERMAL), (SVC, 1, UnloadReason.THERMAL)]
    for uid in (FG, FGS, VIS, PER):
        assert g.state_of(uid, 1) == "loaded"


@pytest.mark.parametrize(
    ("status", "kept"),
    [
        (T.SEVERE, {FG, FGS, VIS, PER}),
        (T.CRITICAL, {FG, FGS}),
        (T.EMERGENCY, {FG}),
        (T.SHUTDOWN, set()),
    ],
)
@pytest.mark.parametrize(("policy", "kw"), POLICIES)
def test_each_status_keeps_only_its_ranks(
    policy: Policy, kw: dict[str, Any], status: ThermalStatus, kept: set[int]
) -> None:
    g = Gov(policy, **kw)
    for uid in IMPORTANCE:
        g.hold(uid, 1)
    out = g.thermal(status)
    asked = {uid for uid, _, reason in asks(out) if reason == UnloadReason.THERMAL}
    assert asked == set(IMPORTANCE) - kept
    assert all(r == UnloadReason.THERMAL for _, _, r in asks(out))
    for uid in kept:
        assert g.state_of(uid, 1) == "loaded"


def test_rising_step_by_step_sheds_progressively() -> None:
    g = Gov()
    for uid in IMPORTANCE:
        g.hold(uid, 1)
    shed: list[set[int]] = []
    for status in (T.LIGHT, T.MODERATE, T.SEVERE, T.CRITICAL, T.EMERGENCY, T.SHUTDOWN):
        shed.append({uid for uid, _, _ in asks(g.thermal(status))})
    assert shed == [set(), set(), {SVC, CACHED}, {VIS, PER}, {FGS}, {FG}]


def test_requests_above_the_cutoff_wait_and_falling_status_lets_them_in() -> None:
    g = Gov()
    g.thermal(T.CRITICAL)
    assert g.request(FG, 1) == LoadStatus.CAN_LOAD_NOW
    assert g.request(FGS, 1) == LoadStatus.CAN_LOAD_NOW
    assert g.request(VIS, 1) == LoadStatus.NOT_PRIORITIZED
    assert g.request(CACHED, 1) == LoadStatus.NOT_PRIORITIZED
    out = g.thermal(T.SEVERE)
    assert granted(out) == [(VIS, 1)]
    out = g.thermal(T.LIGHT)
    assert granted(out) == [(CACHED, 1)]


def test_importance_drop_while_hot_asks_to_unload_with_thermal() -> None:
    g = Gov()
    g.hold(VIS, 1)
    g.thermal(T.SEVERE)
    assert g.state_of(VIS, 1) == "loaded"
    out = g.handle(ev.ImportanceChanged, uid=VIS, importance=int(Importance.CACHED))
    assert asks(out) == [(VIS, 1, UnloadReason.THERMAL)]


# --- the unload deadline -------------------------------------------------------------


def test_holder_ignoring_thermal_unload_is_revoked_at_deadline() -> None:
    g = Gov()
    g.hold(FG, 1)
    g.hold(CACHED, 1)
    out = g.thermal(T.SEVERE)
    assert asks(out) == [(CACHED, 1, UnloadReason.THERMAL)]
    deadline = g.state.params.unload_deadline_s
    assert g.advance(deadline - 0.1) == []  # not yet
    assert g.state_of(CACHED, 1) == "unload_requested"
    out = g.advance(0.1)
    ends = [i for i in out if isinstance(i, ev.EndGrant)]
    assert len(ends) == 1 and ends[0].uid == CACHED and ends[0].revoked
    assert ev.SendComplete(CACHED, CACHED, 1, RequestStatus.REVOKED, g.state.devices()[0]) in out
    assert g.state_of(CACHED, 1) is None
    assert g.state_of(FG, 1) == "loaded"
    assert any(d.what == "unload deadline passed" for d in g.state.story(CACHED, 1))


def test_holder_that_complies_is_complete_not_revoked() -> None:
    g = Gov()
    g.hold(SVC, 1)
    g.thermal(T.SEVERE)
    out = g.handle(ev.ModelUnloaded, uid=SVC, conn=SVC, request_id=1)
    assert ev.SendComplete(SVC, SVC, 1, RequestStatus.COMPLETE, g.state.devices()[0]) in out
    assert g.advance(10.0) == []  # the deadline timer was cancelled


# --- end to end: a heated sensor file drives the state ----------------------------------


def test_heating_a_zone_makes_background_leave_and_foreground_stay(tmp_path: Path) -> None:
    sysfs = FakeSysfs(tmp_path)
    zone = sysfs.add_zone("soc", 45.0)
    g = Gov()
    section = dict(Config().section("thermal"))
    section.update(sources=["sysfs"], sysfs_root=str(tmp_path))
    monitor = ThermalMonitor(section, g.clock, lambda: {})
    g.hold(FG, 1)
    g.hold(SVC, 1)
    g.hold(CACHED, 1, ModelPriority.OPPORTUNISTIC)

    def step(temp: float) -> list[ev.Instruction]:
        sysfs.set_temp(zone, temp)
        g.clock.advance(monitor.poll_interval_s)
        before = g.state.thermal_status
        status = monitor.poll()
        return g.thermal(status) if status != before else []

    assert step(55.0) == []
    assert asks(step(62.0)) == []  # LIGHT
    assert asks(step(72.0)) == []  # MODERATE: nobody is asked yet
    assert g.request(CACHED, 2, ModelPriority.OPPORTUNISTIC) == LoadStatus.NOT_PRIORITIZED
    out = step(81.0)  # SEVERE
    assert asks(out) == [(CACHED, 1, UnloadReason.THERMAL), (SVC, 1, UnloadReason.THERMAL)]
    assert step(79.5) == []  # within hysteresis: still SEVERE, nothing new
    g.handle(ev.ModelUnloaded, uid=SVC, conn=SVC, request_id=1)
    out = g.advance(g.state.params.unload_deadline_s)  # CACHED ignored the request
    assert ev.SendComplete(CACHED, CACHED, 1, RequestStatus.REVOKED, g.state.devices()[0]) in out
    assert g.state_of(FG, 1) == "loaded"
    out = step(50.0)  # cooled down: the opportunistic waiter gets in
    assert granted(out) == [(CACHED, 2)]
    assert [t.status for t in monitor.history] == [T.LIGHT, T.MODERATE, T.SEVERE, T.NONE]
