"""ManagerState: the thermal governor, under every policy (virtual time)."""

from __future__ import annotations

import pytest

from npumanager.constants import (
    Importance,
    LoadStatus,
    ModelPriority,
    Policy,
    RequestStatus,
    ThermalStatus,
    UnloadReason,
)
from npumanager.service import events as ev
from npumanager.service.policy import ManagerParams

from .state_harness import Harness, completes, granted, status_of, unloads

FG, FGS, VIS, PERC, SVC, CACHED = 1001, 1002, 1003, 1004, 1005, 1006
OPP = int(ModelPriority.OPPORTUNISTIC)
T = ThermalStatus


def make(policy: Policy = Policy.STATUS_QUO) -> Harness:
    h = Harness(policy=policy)
    for uid, imp in (
        (FG, Importance.FOREGROUND),
        (FGS, Importance.FOREGROUND_SERVICE),
        (VIS, Importance.VISIBLE),
        (PERC, Importance.PERCEPTIBLE),
        (SVC, Importance.SERVICE),
        (CACHED, Importance.CACHED),
    ):
        h.importance(uid, int(imp))
    return h


def hold_everyone(h: Harness) -> None:
    for uid in (FG, FGS, VIS, PERC, SVC, CACHED):
        h.hold(uid, 1)


def asked(out: list[ev.Instruction]) -> set[int]:
    return {uid for (uid, _), reason in unloads(out).items() if reason == UnloadReason.THERMAL}


@pytest.mark.parametrize("policy", list(Policy))
def test_thermal_change_is_passed_to_the_drivers_under_every_policy(policy: Policy) -> None:
    h = make(policy)
    assert h.thermal(T.LIGHT)[0] == ev.SetDriverThermal(T.LIGHT)
    assert h.state.thermal_status is T.LIGHT


def test_light_changes_nothing() -> None:
    h = make()
    hold_everyone(h)
    out = h.thermal(T.LIGHT)
    assert out == [ev.SetDriverThermal(T.LIGHT)]


def test_budget_scales_with_status() -> None:
    h = make(Policy.BUDGET)
    totals = {}
    for status in T:
        h.thermal(status)
        totals[status] = h.state.budget_total
    assert totals == {
        T.NONE: 4,
        T.LIGHT: 4,
        T.MODERATE: 3,
        T.SEVERE: 2,
        T.CRITICAL: 1,
        T.EMERGENCY: 1,
        T.SHUTDOWN: 0,
    }


def test_moderate_shrinks_the_budget_and_asks_the_least_important() -> None:
    h = make(Policy.BUDGET)
    h.hold(FG, 1, 1)
    h.hold(CACHED, 2, 1)  # 4 of 4
    out = h.thermal(T.MODERATE)  # budget 3
    assert unloads(out) == {(CACHED, 2): UnloadReason.THERMAL}
    h.unloaded(CACHED, 2)
    out = h.request(SVC, 3, 1)  # 2 + 2 > 3
    assert status_of(out, SVC, 3) == LoadStatus.NOT_PRIORITIZED


def test_turn_taking_keeps_one_turn_when_warm() -> None:
    h = make(Policy.TURN_TAKING)
    h.thermal(T.CRITICAL)
    assert h.state.budget_total == 1
    assert granted(h.request(FG, 1)) == [(FG, 1)]


def test_memory_budget_scaled_in_bytes() -> None:
    h = make(Policy.MEMORY)
    h.driver_up("npu0", 8 << 30)
    h.thermal(T.SEVERE)
    assert h.state.budget_total == 4 << 30


def test_moderate_new_opportunistic_requests_wait_even_under_status_quo() -> None:
    h = make(Policy.STATUS_QUO)
    h.hold(CACHED, 1, 0, OPP)
    out = h.thermal(T.MODERATE)
    assert unloads(out) == {}  # an opportunistic holder keeps its model at MODERATE
    out = h.request(FG, 2, 0, OPP)
    assert status_of(out, FG, 2) == LoadStatus.NOT_PRIORITIZED
    assert granted(h.request(CACHED, 3)) == [(CACHED, 3)]  # normal requests still go
    out = h.thermal(T.LIGHT)
    assert granted(out) == [(FG, 2)]


def test_severe_asks_holders_ranked_above_perceptible_opportunistic_first() -> None:
    h = make(Policy.STATUS_QUO)
    hold_everyone(h)
    h.hold(FG, 2, 0, OPP)  # rank 2100
    out = h.thermal(T.SEVERE)
    asks = [i for i in out if isinstance(i, ev.AskUnload)]
    assert [(i.uid, i.request_id) for i in asks] == [(FG, 2), (CACHED, 1), (SVC, 1)]
    assert all(i.reason == UnloadReason.THERMAL for i in asks)
    for uid in (FG, FGS, VIS, PERC):
        assert h.state_of(uid, 1) == "loaded"


@pytest.mark.parametrize(
    ("status", "kept"),
    [
        (T.SEVERE, {FG, FGS, VIS, PERC}),
        (T.CRITICAL, {FG, FGS}),
        (T.EMERGENCY, {FG}),
        (T.SHUTDOWN, set()),
    ],
)
def test_each_status_keeps_only_its_ranks(status: ThermalStatus, kept: set[int]) -> None:
    h = make(Policy.STATUS_QUO)
    hold_everyone(h)
    out = h.thermal(status)
    assert asked(out) == {FG, FGS, VIS, PERC, SVC, CACHED} - kept


def test_hot_requests_outside_the_allowed_rank_wait_and_do_not_block_others() -> None:
    h = make(Policy.BUDGET)
    h.thermal(T.CRITICAL)  # budget 1, keep rank <= 125
    out = h.request(CACHED, 1)
    assert status_of(out, CACHED, 1) == LoadStatus.NOT_PRIORITIZED
    assert granted(h.request(FGS, 2)) == [(FGS, 2)]
    assert h.state.dump(h.now)["parked"] == [[CACHED, 1]]


def test_falling_status_lets_waiters_back_in() -> None:
    h = make(Policy.STATUS_QUO)
    hold_everyone(h)
    h.thermal(T.SEVERE)
    for uid in (SVC, CACHED):
        h.unloaded(uid, 1)
    h.request(SVC, 2)
    h.request(CACHED, 3)
    assert h.state_of(SVC, 2) == h.state_of(CACHED, 3) == "queued"
    out = h.thermal(T.MODERATE)
    assert granted(out) == [(SVC, 2), (CACHED, 3)]


def test_rising_importance_while_hot_gets_a_waiter_in() -> None:
    h = make(Policy.STATUS_QUO)
    h.thermal(T.EMERGENCY)
    h.request(VIS, 1)
    assert h.state_of(VIS, 1) == "queued"
    assert granted(h.importance(VIS, int(Importance.FOREGROUND))) == [(VIS, 1)]


def test_falling_importance_while_hot_asks_the_holder() -> None:
    h = make(Policy.STATUS_QUO)
    h.hold(VIS, 1)
    h.thermal(T.SEVERE)
    out = h.importance(VIS, int(Importance.CACHED))
    assert unloads(out) == {(VIS, 1): UnloadReason.THERMAL}


def test_holder_ignoring_a_thermal_unload_is_revoked_at_the_deadline() -> None:
    h = make(Policy.STATUS_QUO)
    h.hold(CACHED, 1)
    h.thermal(T.SEVERE)
    assert h.advance(4.0) == []
    out = h.advance(1.0)
    assert completes(out) == {(CACHED, 1): RequestStatus.REVOKED}
    assert next(i for i in out if isinstance(i, ev.EndGrant)).revoked


def test_shutdown_holds_everything_back() -> None:
    h = make(Policy.STATUS_QUO)
    h.thermal(T.SHUTDOWN)
    out = h.request(0, 1)  # even root waits
    assert status_of(out, 0, 1) == LoadStatus.NOT_PRIORITIZED
    assert h.state.budget_total == 0
    assert granted(h.thermal(T.NONE)) == [(0, 1)]


def test_thermal_knobs_are_configurable() -> None:
    params = ManagerParams(
        thermal_budget_scale={T.MODERATE: 0.5},
        thermal_keep_rank={T.MODERATE: int(Importance.VISIBLE)},
        opportunistic_wait_from=T.SEVERE,
    )
    h = Harness(params)
    h.importance(FG, 100)
    h.importance(PERC, 230)
    h.hold(FG, 1, 0, OPP)
    h.hold(PERC, 2)
    out = h.thermal(T.MODERATE)
    assert unloads(out) == {(FG, 1): UnloadReason.THERMAL, (PERC, 2): UnloadReason.THERMAL}
    assert h.state.budget_total == 2


def test_dump_shows_thermal_state() -> None:
    h = make(Policy.BUDGET)
    h.thermal(T.SEVERE)
    d = h.state.dump(h.now)
    assert d["thermal"] == {
        "status": "SEVERE",
        "budget_scale": 0.5,
        "keep_rank": 230,
        "opportunistic_wait": True,
        "devices": {"default": "SEVERE"},
    }
    assert d["budget"]["total"] == 4 and d["budget"]["thermal_scaled"] == 2
    assert "thermal=SEVERE" in repr(h.state)
