"""ManagerState: request lifecycle, budget policies, ranking and fairness (virtual time)."""

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
from npumanager.errors import InvalidArgument, LimitExceeded, UnknownRequest
from npumanager.hal.types import EndReason, SchedulingConfig
from npumanager.service import events as ev
from npumanager.service.policy import ManagerParams

from .state_harness import Harness, completes, for_key, granted, status_of, unloads

FG, FGS, VIS, BG, CACHED = 1001, 1002, 1003, 1004, 1005
BIG, MID, SMALL = 2, 1, 0
BGP, OPP = int(ModelPriority.BACKGROUND), int(ModelPriority.OPPORTUNISTIC)


def budget(**kw: object) -> Harness:
    h = Harness(policy=kw.pop("policy", Policy.BUDGET))
    for uid, imp in (
        (FG, Importance.FOREGROUND),
        (FGS, Importance.FOREGROUND_SERVICE),
        (VIS, Importance.VISIBLE),
        (BG, Importance.SERVICE),
        (CACHED, Importance.CACHED),
    ):
        h.importance(uid, int(imp))
    return h


# --- lifecycle ----------------------------------------------------------------------


def test_lifecycle_grant_load_unload_complete() -> None:
    h = budget()
    out = h.request(FG, 1)
    assert [type(i) for i in out] == [ev.IssueGrant, ev.SendCanLoad]
    assert out == [
        ev.IssueGrant(FG, 1, "grant-0001"),
        ev.SendCanLoad(FG, FG, 1, LoadStatus.CAN_LOAD_NOW, "grant-0001"),
    ]
    assert h.state_of(FG, 1) == "granted"
    assert h.loaded(FG, 1) == []
    assert h.state_of(FG, 1) == "loaded"
    out = h.unloaded(FG, 1)
    assert out == [
        ev.EndGrant("grant-0001", FG, 1, revoked=False),
        ev.SendComplete(FG, FG, 1, RequestStatus.COMPLETE),
    ]
    assert h.state_of(FG, 1) is None
    assert h.state.budget_used == 0


def test_granted_request_may_unload_without_loading() -> None:
    h = budget()
    h.request(FG, 1)
    assert completes(h.unloaded(FG, 1)) == {(FG, 1): RequestStatus.COMPLETE}


def test_loaded_twice_is_harmless() -> None:
    h = budget()
    h.hold(FG, 1)
    assert h.loaded(FG, 1) == []


def test_cancel_queued_request() -> None:
    h = budget()
    h.hold(FG, 1, BIG)
    assert status_of(h.request(BG, 2), BG, 2) == LoadStatus.NOT_PRIORITIZED
    out = h.cancel(BG, 2)
    assert out == [ev.SendComplete(BG, BG, 2, RequestStatus.CANCELLED)]


def test_cancel_granted_request_ends_its_grant() -> None:
    h = budget()
    h.hold(FG, 1)
    out = h.cancel(FG, 1)
    assert out == [
        ev.EndGrant("grant-0001", FG, 1, revoked=False),
        ev.SendComplete(FG, FG, 1, RequestStatus.CANCELLED),
    ]


def test_unknown_request_raises_unknown_request() -> None:
    h = budget()
    for call in (h.cancel, h.loaded, h.unloaded):
        with pytest.raises(UnknownRequest):
            call(FG, 99)


def test_another_uids_request_cannot_be_named() -> None:
    h = budget()
    h.hold(FG, 1)
    with pytest.raises(UnknownRequest):
        h.cancel(BG, 1)
    assert h.state_of(FG, 1) == "loaded"


def test_loaded_before_grant_is_refused() -> None:
    h = budget()
    h.hold(FG, 1, BIG)
    h.request(BG, 2)
    with pytest.raises(InvalidArgument):
        h.loaded(BG, 2)
    with pytest.raises(InvalidArgument):
        h.unloaded(BG, 2)
    assert h.state_of(BG, 2) == "queued"


def test_reused_id_refused_while_live() -> None:
    h = budget()
    h.request(FG, 1)
    with pytest.raises(InvalidArgument, match="still live"):
        h.request(FG, 1, conn=77)
    assert h.state_of(FG, 1) == "granted"


def test_reused_id_refused_on_same_connection_even_after_it_ended() -> None:
    h = budget()
    h.request(FG, 1)
    h.unloaded(FG, 1)
    with pytest.raises(InvalidArgument, match="once per connection"):
        h.request(FG, 1)
    # Another connection of the same uid may use the id again.
    assert granted(h.request(FG, 1, conn=555)) == [(FG, 1)]


def test_same_id_from_two_uids_is_two_requests() -> None:
    h = budget()
    h.request(FG, 7, MID)
    h.request(BG, 7, MID)
    assert h.state_of(FG, 7) == h.state_of(BG, 7) == "granted"
    h.unloaded(FG, 7)
    assert h.state_of(FG, 7) is None and h.state_of(BG, 7) == "granted"


def test_max_requests_per_uid() -> None:
    h = Harness(ManagerParams(max_requests_per_uid=2), policy=Policy.STATUS_QUO)
    h.request(FG, 1)
    h.request(FG, 2)
    with pytest.raises(LimitExceeded):
        h.request(FG, 3)
    h.unloaded(FG, 1)
    h.request(FG, 3)


def test_bad_size_or_priority_refused() -> None:
    h = budget()
    with pytest.raises(InvalidArgument):
        h.handle(h.mk(ev.RequestLoad, uid=FG, pid=1, conn=FG, request_id=1, size=9))
    assert h.state_of(FG, 1) is None


def test_terminal_status_ends_everything() -> None:
    h = budget()
    h.hold(FG, 1)
    h.unloaded(FG, 1)
    with pytest.raises(UnknownRequest):
        h.unloaded(FG, 1)
    assert h.advance(60) == []


# --- status quo ------------------------------------------------------------------------


def test_status_quo_grants_everything() -> None:
    h = Harness(policy=Policy.STATUS_QUO)
    for rid in range(20):
        assert granted(h.request(BG, rid, BIG)) == [(BG, rid)]
    assert h.state.budget_total is None


# --- budget ------------------------------------------------------------------------------


def test_budget_fits_then_queues() -> None:
    h = budget()
    h.hold(VIS, 1, MID)
    h.hold(VIS, 2, MID)
    out = h.request(VIS, 3, SMALL)
    assert status_of(out, VIS, 3) == LoadStatus.NOT_PRIORITIZED
    assert h.state.budget_used == 4


def test_budget_foreground_preempts_background_holder() -> None:
    h = budget()
    h.hold(BG, 1, BIG)
    out = h.request(FG, 2, BIG)
    assert unloads(out) == {(BG, 1): UnloadReason.PREEMPTED}
    assert status_of(out, FG, 2) == LoadStatus.WAIT_FOR_UNLOAD
    assert h.state_of(BG, 1) == "unload_requested"
    out = h.unloaded(BG, 1)
    assert completes(out) == {(BG, 1): RequestStatus.COMPLETE}
    assert granted(out) == [(FG, 2)]


def test_granted_not_loaded_victim_asked_to_unload() -> None:
    h = budget()
    h.request(BG, 1, BIG)  # granted, never reports loaded
    out = h.request(FG, 2, BIG)
    assert unloads(out) == {(BG, 1): UnloadReason.PREEMPTED}
    out = h.unloaded(BG, 1)  # unloaded without ever loading
    assert granted(out) == [(FG, 2)]


def test_granted_victim_that_finishes_loading_stays_asked() -> None:
    h = budget()
    h.request(BG, 1, BIG)
    h.request(FG, 2, BIG)
    assert h.loaded(BG, 1) == []
    assert h.state_of(BG, 1) == "unload_requested"


def test_victim_walk_never_past_a_more_important_holder() -> None:
    h = budget()
    h.hold(FG, 1, MID)
    h.hold(CACHED, 2, MID)
    out = h.request(VIS, 3, BIG)  # needs 4: CACHED frees 2, FG is more important
    assert unloads(out) == {}
    assert status_of(out, VIS, 3) == LoadStatus.NOT_PRIORITIZED


def test_victims_least_important_first_and_only_enough() -> None:
    h = budget()
    h.hold(VIS, 1, SMALL)
    h.hold(BG, 2, SMALL)
    h.hold(CACHED, 3, MID)
    out = h.request(FG, 4, MID)
    assert unloads(out) == {(CACHED, 3): UnloadReason.PREEMPTED}


def test_queued_request_is_never_a_victim() -> None:
    h = budget()
    h.hold(VIS, 1, BIG)
    h.request(CACHED, 2, SMALL)  # queued behind
    assert h.state_of(CACHED, 2) == "queued"
    out = h.request(FG, 3, BIG)
    assert unloads(out) == {(VIS, 1): UnloadReason.PREEMPTED}
    assert all(k != (CACHED, 2) for k in unloads(out))
    assert completes(out) == {}
    assert h.state_of(CACHED, 2) == "queued"


def test_own_holders_are_not_victims() -> None:
    h = budget()
    h.hold(FG, 1, BIG)
    out = h.request(FG, 2, SMALL)
    assert unloads(out) == {} and status_of(out, FG, 2) == LoadStatus.NOT_PRIORITIZED


def test_not_prioritized_queued_then_granted_in_rank_order() -> None:
    h = budget()
    h.hold(VIS, 1, BIG)
    h.request(CACHED, 10, SMALL)
    h.request(BG, 11, SMALL)
    h.request(CACHED, 12, SMALL)
    h.request(BG, 13, SMALL)
    for uid, rid in ((CACHED, 10), (BG, 11), (CACHED, 12), (BG, 13)):
        assert h.state_of(uid, rid) == "queued"
    out = h.unloaded(VIS, 1)
    assert granted(out) == [(BG, 11), (BG, 13), (CACHED, 10), (CACHED, 12)]


def test_waiter_status_updates_from_not_prioritized_to_wait_for_unload() -> None:
    h = budget()
    h.hold(VIS, 1, BIG)
    assert status_of(h.request(BG, 2, BIG), BG, 2) == LoadStatus.NOT_PRIORITIZED
    out = h.importance(VIS, int(Importance.CACHED))  # the holder is now less important
    assert unloads(out) == {(VIS, 1): UnloadReason.PREEMPTED}
    assert status_of(out, BG, 2) == LoadStatus.WAIT_FOR_UNLOAD
    assert granted(h.unloaded(VIS, 1)) == [(BG, 2)]


def test_new_request_does_not_jump_over_a_better_ranked_waiter() -> None:
    h = budget()
    h.hold(FG, 1, MID)
    h.hold(FG, 2, SMALL)  # 3/4 used by the most important uid
    out = h.request(VIS, 3, MID)  # needs 2: no victims (FG is more important)
    assert status_of(out, VIS, 3) == LoadStatus.NOT_PRIORITIZED
    out = h.request(CACHED, 4, SMALL)  # would fit, but VIS waits ahead of it
    assert status_of(out, CACHED, 4) == LoadStatus.NOT_PRIORITIZED
    out = h.unloaded(FG, 2)
    assert granted(out) == [(VIS, 3)]
    assert h.state_of(CACHED, 4) == "queued"


def test_better_ranked_newcomer_is_granted_ahead_of_worse_waiters() -> None:
    h = budget()
    h.hold(FG, 1, MID)
    h.hold(FG, 2, SMALL)
    h.request(CACHED, 3, MID)  # queued: needs 2
    out = h.request(VIS, 4, SMALL)  # better than the waiter and fits
    assert granted(out) == [(VIS, 4)]


def test_importance_drop_re_ranks() -> None:
    h = budget()
    h.hold(VIS, 1, BIG)
    h.request(BG, 2, BIG)
    assert h.state_of(BG, 2) == "queued"
    out = h.importance(VIS, int(Importance.GONE))
    assert unloads(out) == {(VIS, 1): UnloadReason.PREEMPTED}
    assert h.state.importance(VIS) == 1000


def test_importance_rise_moves_a_waiter_ahead() -> None:
    h = budget()
    h.hold(FG, 1, BIG)
    h.request(CACHED, 2, SMALL)
    h.request(BG, 3, SMALL)
    h.importance(CACHED, int(Importance.VISIBLE))
    out = h.unloaded(FG, 1)
    assert granted(out) == [(CACHED, 2), (BG, 3)]


def test_importance_pushes_scheduling_config_only_on_change() -> None:
    h = Harness()
    out = h.importance(FG, 100)
    assert out == [ev.PushSchedulingConfigs((SchedulingConfig(FG, app_priority=100),))]
    assert h.importance(FG, 100) == []
    assert h.importance(BG, 1000) == []  # an unknown uid already has 1000
    assert h.importance(BG, 5000) == []  # clamped to 1000: unchanged
    assert SchedulingConfig(FG, app_priority=100) in h.state.scheduling_table()


def test_uid_zero_is_fixed_foreground() -> None:
    h = Harness()
    assert h.state.importance(0) == 100
    assert h.importance(0, 1000) == []
    assert h.state.importance(0) == 100
    assert h.state.importance(4242) == 1000


def test_negative_importance_refused() -> None:
    h = Harness()
    with pytest.raises(InvalidArgument):
        h.importance(FG, -1)


def test_cancel_of_waiter_lets_the_next_in() -> None:
    h = budget()
    h.hold(FG, 1, MID)
    h.hold(FG, 2, SMALL)
    h.request(VIS, 3, MID)
    h.request(CACHED, 4, SMALL)
    out = h.cancel(VIS, 3)
    assert granted(out) == [(CACHED, 4)]


def test_big_waiter_not_starved_by_later_small_ones() -> None:
    h = budget()
    h.hold(VIS, 1, MID)
    h.hold(VIS, 2, MID)
    h.request(BG, 3, BIG)  # queued, head
    for rid in range(10, 15):
        h.request(CACHED, rid, SMALL)  # all queue behind BG
    out = h.unloaded(VIS, 1)
    assert granted(out) == []  # 2 free: BG needs 4 and is first in line
    out = h.unloaded(VIS, 2)
    assert granted(out) == [(BG, 3)]


def test_request_larger_than_the_budget_waits_without_blocking_others() -> None:
    h = budget()
    h.policy(int(Policy.BUDGET), max_budget=2)
    out = h.request(FG, 1, BIG)  # weight 4 > budget 2: can never fit now
    assert status_of(out, FG, 1) == LoadStatus.NOT_PRIORITIZED
    assert granted(h.request(CACHED, 2, SMALL)) == [(CACHED, 2)]
    out = h.policy(int(Policy.BUDGET), max_budget=8)
    assert granted(out) == [(FG, 1)]


def test_client_death_drops_requests_without_callbacks() -> None:
    h = budget()
    h.hold(VIS, 4, SMALL)  # another client, untouched
    h.hold(BG, 1, MID)
    h.request(BG, 2, SMALL)  # granted, not loaded
    h.request(BG, 3, BIG)  # queued
    h.request(CACHED, 5, BIG)  # queued behind BG's
    out = h.gone(BG)
    assert {type(i) for i in out if not isinstance(i, ev.CancelTimer)} <= {
        ev.EndGrant,
        ev.IssueGrant,
        ev.SendCanLoad,
    }
    ended = [i for i in out if isinstance(i, ev.EndGrant)]
    assert {(i.uid, i.request_id, i.revoked) for i in ended} == {(BG, 1, False), (BG, 2, False)}
    assert not any(getattr(i, "conn", None) == BG for i in out)
    assert h.state_of(BG, 1) is h.state_of(BG, 2) is h.state_of(BG, 3) is None
    assert h.state_of(VIS, 4) == "loaded"
    assert h.state_of(CACHED, 5) == "queued"  # 1 used + 4 > 4
    assert granted(h.unloaded(VIS, 4)) == [(CACHED, 5)]


def test_client_death_of_a_victim_lets_the_waiter_in() -> None:
    h = budget()
    h.hold(BG, 1, BIG)
    h.request(FG, 2, BIG)
    out = h.gone(BG)
    assert granted(out) == [(FG, 2)]
    assert h.advance(10) == []  # the victim's deadline timer was cancelled


def test_dead_connection_may_reuse_ids_on_a_new_connection() -> None:
    h = budget()
    h.request(BG, 1)
    h.gone(BG)
    assert granted(h.request(BG, 1)) == [(BG, 1)]  # conn id BG again: its history is gone


# --- turn taking and weights ---------------------------------------------------------


def test_turn_taking_one_at_a_time() -> None:
    h = budget(policy=Policy.TURN_TAKING)
    assert granted(h.request(VIS, 1, SMALL)) == [(VIS, 1)]
    out = h.request(BG, 2, SMALL)
    assert status_of(out, BG, 2) == LoadStatus.NOT_PRIORITIZED
    assert granted(h.unloaded(VIS, 1)) == [(BG, 2)]
    assert h.state.settings.max_budget == 1
    assert dict(h.state.settings.weights) == {0: 1, 1: 1, 2: 1}


def test_turn_taking_ignores_size() -> None:
    h = budget(policy=Policy.TURN_TAKING)
    h.hold(BG, 1, BIG)
    out = h.request(FG, 2, SMALL)
    assert unloads(out) == {(BG, 1): UnloadReason.PREEMPTED}


def test_weights_are_configurable() -> None:
    h = budget()
    h.policy(int(Policy.BUDGET), max_budget=6, weights={2: 3})
    h.hold(VIS, 1, BIG)  # 3
    h.hold(VIS, 2, BIG)  # 6
    assert status_of(h.request(VIS, 3, SMALL), VIS, 3) == LoadStatus.NOT_PRIORITIZED
    assert h.state.budget_used == 6
    assert dict(h.state.settings.weights) == {0: 1, 1: 2, 2: 3}


@pytest.mark.parametrize(
    "kw",
    [
        {"policy": 99},
        {"policy": -1},
        {"policy": int(Policy.BUDGET), "max_budget": 0},
        {"policy": int(Policy.BUDGET), "max_budget": -4},
        {"policy": int(Policy.BUDGET), "weights": {2: 0}},
        {"policy": int(Policy.BUDGET), "weights": {1: -1}},
        {"policy": int(Policy.BUDGET), "weights": {7: 1}},
        {"policy": int(Policy.TURN_TAKING), "max_budget": 0},
        {"policy": int(Policy.MEMORY), "memory_budget_bytes": -1},
    ],
)
def test_bad_policies_raise_and_change_nothing(kw: dict[str, object]) -> None:
    h = budget()
    h.hold(VIS, 1, MID)
    before = h.state.dump(h.now)
    n = len(h.state.decisions())
    with pytest.raises(InvalidArgument):
        h.policy(**kw)  # type: ignore[arg-type]
    assert h.state.dump(h.now) == before
    assert len(h.state.decisions()) == n


def test_policy_change_asks_holders_that_no_longer_fit() -> None:
    h = budget()
    h.hold(FG, 1, MID)
    h.hold(CACHED, 2, MID)
    out = h.policy(int(Policy.TURN_TAKING))
    assert unloads(out) == {(CACHED, 2): UnloadReason.POLICY_CHANGED}
    assert h.state_of(FG, 1) == "loaded"


def test_policy_change_to_status_quo_grants_the_queue() -> None:
    h = budget()
    h.hold(FG, 1, BIG)
    h.request(BG, 2, BIG)
    h.request(CACHED, 3, BIG)
    out = h.policy(int(Policy.STATUS_QUO))
    assert granted(out) == [(BG, 2), (CACHED, 3)]


# --- opportunistic -------------------------------------------------------------------


def test_opportunistic_never_preempts() -> None:
    h = budget()
    h.hold(CACHED, 1, BIG)
    out = h.request(FG, 2, SMALL, OPP)
    assert unloads(out) == {}
    assert status_of(out, FG, 2) == LoadStatus.NOT_PRIORITIZED


def test_opportunistic_is_the_first_victim() -> None:
    h = budget()
    h.hold(FG, 1, MID, OPP)  # rank 2100
    h.hold(CACHED, 2, MID)  # rank 400
    out = h.request(VIS, 3, MID)
    assert unloads(out) == {(FG, 1): UnloadReason.PREEMPTED}


def test_background_prefetch_of_foreground_yields_to_user_facing_load() -> None:
    h = budget()
    h.hold(FG, 1, BIG, BGP)  # rank 1100
    out = h.request(CACHED, 2, BIG)  # rank 400
    assert unloads(out) == {(FG, 1): UnloadReason.PREEMPTED}


# --- unload deadline -----------------------------------------------------------------


def test_revocation_after_the_deadline() -> None:
    h = budget()
    h.hold(BG, 1, BIG)
    out = h.request(FG, 2, BIG)
    timer = next(i for i in out if isinstance(i, ev.ArmTimer))
    assert timer.at == h.now + 5.0
    assert h.advance(4.9) == []
    out = h.advance(0.2)
    assert for_key(out, BG, 1) == [
        ev.EndGrant("grant-0001", BG, 1, revoked=True),
        ev.SendComplete(BG, BG, 1, RequestStatus.REVOKED),
    ]
    assert granted(out) == [(FG, 2)]
    story = [d.what for d in h.state.story(BG, 1)]
    assert story[-2:] == ["unload deadline passed", "revoked"]


def test_unloading_in_time_cancels_the_deadline() -> None:
    h = budget()
    h.hold(BG, 1, BIG)
    h.request(FG, 2, BIG)
    out = h.unloaded(BG, 1)
    assert any(isinstance(i, ev.CancelTimer) for i in out)
    assert h.advance(60) == []


def test_early_timer_is_rearmed() -> None:
    h = budget()
    h.hold(BG, 1, BIG)
    h.request(FG, 2, BIG)
    key = next(iter(h.timers))
    out = h.handle(h.mk(ev.TimerFired, key=key))  # fired too soon
    assert out == [ev.ArmTimer(key, h.timers[key])]
    assert h.state_of(BG, 1) == "unload_requested"


def test_stale_timer_does_nothing() -> None:
    h = budget()
    assert h.handle(h.mk(ev.TimerFired, key="unload:1:2:3")) == []


def test_custom_unload_deadline() -> None:
    h = Harness(ManagerParams(unload_deadline_s=0.5))
    h.importance(FG, 100)
    h.hold(BG, 1, BIG)
    h.request(FG, 2, BIG)
    assert completes(h.advance(0.5)) == {(BG, 1): RequestStatus.REVOKED}


# --- max queue wait ------------------------------------------------------------------


def test_max_queue_wait_cancels() -> None:
    h = Harness(ManagerParams(max_queue_wait_s=30.0))
    h.importance(FG, 100)
    h.hold(FG, 1, BIG)
    h.request(BG, 2, SMALL)
    assert h.advance(29) == []
    assert completes(h.advance(2)) == {(BG, 2): RequestStatus.CANCELLED}
    assert h.state_of(FG, 1) == "loaded"


def test_max_queue_wait_timer_cancelled_on_grant() -> None:
    h = Harness(ManagerParams(max_queue_wait_s=30.0))
    h.hold(FG, 1, BIG)
    h.request(BG, 2, SMALL)
    h.advance(10)
    assert granted(h.unloaded(FG, 1)) == [(BG, 2)]
    assert h.advance(60) == []
    assert h.state_of(BG, 2) == "granted"


def test_no_queue_wait_by_default() -> None:
    h = budget()
    h.hold(FG, 1, BIG)
    h.request(BG, 2)
    assert h.advance(3600) == []
    assert h.state_of(BG, 2) == "queued"


# --- fairness ---------------------------------------------------------------------------


def test_fairness_on_completed_asks_the_holder_when_an_equal_peer_waits() -> None:
    h = budget(policy=Policy.TURN_TAKING)
    h.importance(VIS + 10, int(Importance.VISIBLE))
    h.hold(VIS, 1)
    h.request(VIS + 10, 2)  # equal rank, neither completed work: no victim
    assert h.state_of(VIS + 10, 2) == "queued"
    out = h.completed(VIS)
    assert unloads(out) == {(VIS, 1): UnloadReason.FAIRNESS}
    assert status_of(out, VIS + 10, 2) == LoadStatus.WAIT_FOR_UNLOAD
    out = h.unloaded(VIS, 1)
    assert granted(out) == [(VIS + 10, 2)]


def test_fairness_ignores_other_end_reasons_and_unequal_peers() -> None:
    h = budget(policy=Policy.TURN_TAKING)
    h.hold(VIS, 1)
    h.request(CACHED, 2)  # less important: not a peer
    assert h.completed(VIS) == []
    h.importance(VIS + 10, int(Importance.VISIBLE))
    h.request(VIS + 10, 3)
    assert h.completed(VIS, EndReason.FAILED) == []
    assert h.completed(VIS, EndReason.PAUSED) == []


def test_equal_rank_yields_to_whoever_completed_work_less_recently() -> None:
    h = budget(policy=Policy.TURN_TAKING)
    peer = VIS + 10
    h.importance(peer, int(Importance.VISIBLE))
    h.completed(peer)  # the peer had a turn long ago
    h.now += 10
    h.hold(VIS, 1)
    h.completed(VIS)  # VIS completed work more recently: it yields
    h.now += 1
    out = h.request(peer, 2)
    assert unloads(out) == {(VIS, 1): UnloadReason.PREEMPTED}
    assert status_of(out, peer, 2) == LoadStatus.WAIT_FOR_UNLOAD


def test_equal_rank_does_not_yield_to_a_more_recent_completer() -> None:
    h = budget(policy=Policy.TURN_TAKING)
    peer = VIS + 10
    h.importance(peer, int(Importance.VISIBLE))
    h.hold(VIS, 1)  # VIS never completed work
    h.completed(peer)
    out = h.request(peer, 2)
    assert unloads(out) == {}


# --- memory policy ---------------------------------------------------------------------

GIB = 1 << 30


def memory() -> Harness:
    h = budget(policy=Policy.MEMORY)
    h.driver_up("reference", 8 * GIB)
    return h


def test_memory_policy_budget_from_drivers() -> None:
    h = memory()
    assert h.state.budget_total == 8 * GIB
    h.hold(VIS, 1, BIG)  # 4 GiB declared
    h.hold(VIS, 2, MID)  # 2 GiB
    h.hold(VIS, 3, MID)  # 2 GiB: 8 of 8
    assert status_of(h.request(VIS, 4, SMALL), VIS, 4) == LoadStatus.NOT_PRIORITIZED
    assert h.state.budget_used == 8 * GIB


def test_memory_policy_charges_real_size() -> None:
    h = memory()
    h.hold(CACHED, 1, SMALL)  # declared < 1 GiB
    h.hold(VIS, 2, SMALL)
    out = h.memory(h.grant_of(CACHED, 1), 7 * GIB + 1)  # it lied: really 7 GiB and more
    assert unloads(out) == {(CACHED, 1): UnloadReason.MEMORY_PRESSURE}
    assert h.state.budget_used == 8 * GIB + 1
    # Until it leaves, nobody else fits.
    assert status_of(h.request(FG, 3, SMALL), FG, 3) == LoadStatus.WAIT_FOR_UNLOAD
    assert granted(h.unloaded(CACHED, 1)) == [(FG, 3)]


def test_memory_policy_smaller_real_size_still_charged_declared() -> None:
    h = memory()
    h.hold(VIS, 1, BIG)
    h.memory(h.grant_of(VIS, 1), 100)
    assert h.state.budget_used == 4 * GIB


def test_memory_policy_fixed_budget() -> None:
    h = memory()
    h.policy(int(Policy.MEMORY), memory_budget_bytes=2 * GIB)
    assert h.state.budget_total == 2 * GIB
    h.hold(VIS, 1, MID)
    assert status_of(h.request(VIS, 2, SMALL), VIS, 2) == LoadStatus.NOT_PRIORITIZED


def test_memory_for_an_ended_grant_is_ignored() -> None:
    h = memory()
    assert h.memory("no-such-grant", GIB) == []


def test_driver_down_keeps_grants_and_waits_new_requests() -> None:
    h = memory()
    h.hold(VIS, 1, BIG)
    out = h.driver_down("reference")
    assert unloads(out) == {} and h.state_of(VIS, 1) == "loaded"
    assert status_of(h.request(FG, 2, SMALL), FG, 2) == LoadStatus.NOT_PRIORITIZED
    out = h.driver_up("reference", 8 * GIB)
    assert granted(out) == [(FG, 2)]


def test_driver_reporting_less_memory_sheds() -> None:
    h = memory()
    h.hold(FG, 1, BIG)
    h.hold(CACHED, 2, BIG)
    out = h.driver_up("reference", 4 * GIB)
    assert unloads(out) == {(CACHED, 2): UnloadReason.MEMORY_PRESSURE}


def test_memory_policy_without_drivers_waits() -> None:
    h = budget(policy=Policy.MEMORY)
    assert status_of(h.request(FG, 1), FG, 1) == LoadStatus.NOT_PRIORITIZED
    assert granted(h.driver_up("npu0", GIB)) == [(FG, 1)]


# --- log, story, dump, repr ------------------------------------------------------------


def test_story_replays_one_request() -> None:
    h = budget()
    h.hold(BG, 1, BIG)
    h.request(FG, 2, BIG)
    h.unloaded(BG, 1)
    story = h.state.story(FG, 2)
    assert [d.what for d in story] == ["requested", "wait_for_unload", "granted"]
    assert all(d.key == (FG, 2) for d in story)
    assert [d.what for d in h.state.story(BG, 1)][-2:] == ["asked to unload", "complete"]


def test_decision_log_is_bounded() -> None:
    h = Harness(ManagerParams(decision_log_size=10), policy=Policy.STATUS_QUO)
    for rid in range(50):
        h.request(FG, rid)
    assert len(h.state.decisions()) == 10


def test_dump_is_json_and_complete() -> None:
    import json

    h = budget()
    h.hold(BG, 1, BIG)
    h.now += 2
    h.request(FG, 2, BIG)
    h.request(CACHED, 3, SMALL)
    d = json.loads(json.dumps(h.state.dump(h.now + 1)))
    assert d["policy"] == {
        "name": "budget",
        "max_budget": 4,
        "weights": {"0": 1, "1": 2, "2": 4},
        "memory_budget_bytes": 0,
    }
    assert d["budget"]["used"] == 4 and d["budget"]["thermal_scaled"] == 4
    assert d["thermal"]["status"] == "NONE"
    assert d["uids"][str(FG)]["importance"] == 100
    assert d["uids"][str(FG)]["app_priority"] == 100
    reqs = {(r["uid"], r["request_id"]): r for r in d["requests"]}
    assert reqs[(BG, 1)]["state"] == "unload_requested"
    assert reqs[(BG, 1)]["age_s"] == 3.0
    assert reqs[(BG, 1)]["grant"] == "grant-00"
    assert reqs[(FG, 2)]["state"] == "waiting"
    assert reqs[(CACHED, 3)]["rank"] == 400
    assert d["queue"] == [[FG, 2], [CACHED, 3]]


def test_repr_reads_like_a_summary() -> None:
    h = budget()
    h.hold(VIS, 1, SMALL)
    h.hold(VIS, 2, SMALL)
    h.request(VIS, 3, SMALL)
    h.request(VIS, 4, BIG)
    assert repr(h.state) == "policy=budget 3/4 used | 2 loaded, 1 granted, 1 waiting"


def test_from_config_reads_defaults() -> None:
    from npumanager.config import Config

    p = ManagerParams.from_config(Config())
    assert p.policy.policy is Policy.BUDGET
    assert p.max_budget == 4 and dict(p.weights) == {0: 1, 1: 2, 2: 4}
    assert p.unload_deadline_s == 5.0 and p.max_queue_wait_s == 0.0
    assert p.max_requests_per_uid == 256 and p.default_importance == 1000
    assert p.size_bytes == {0: 1 << 30, 1: 2 << 30, 2: 4 << 30}
    assert p.thermal_budget_scale[ThermalStatus.MODERATE] == 0.75
    assert p.thermal_keep_rank[ThermalStatus.SEVERE] == 230
    assert p.thermal_keep_rank[ThermalStatus.MODERATE] is None
    assert p.thermal_keep_rank[ThermalStatus.SHUTDOWN] == -1
    assert p.opportunistic_wait_from is ThermalStatus.MODERATE


def test_from_config_overrides_and_rejects_bad_values() -> None:
    from npumanager.config import Config

    cfg = Config.load(
        overrides={
            "policy": {"name": "turn_taking"},
            "manager": {"unload_deadline_s": 1.5, "max_queue_wait_s": 9},
        }
    )
    p = ManagerParams.from_config(cfg)
    assert p.policy.policy is Policy.TURN_TAKING and p.max_budget == 1
    assert p.unload_deadline_s == 1.5 and p.max_queue_wait_s == 9.0
    for bad in ({"name": "nope"}, {"max_budget": 0}, {"weights": {"2": -1}}):
        with pytest.raises(InvalidArgument):
            ManagerParams.from_config(Config.load(overrides={"policy": bad}))


def test_from_config_thermal_knobs() -> None:
    from npumanager.config import Config

    cfg = Config.load(
        overrides={
            "policy": {
                "thermal_budget_scale": {"moderate": 0.5, "4": 0.1},
                "thermal_keep_rank": {"severe": 1000000, "critical": 300},
                "opportunistic_wait_from": "severe",
                "size_bytes": {"0": 512},
            }
        }
    )
    p = ManagerParams.from_config(cfg)
    assert p.thermal_budget_scale[ThermalStatus.MODERATE] == 0.5
    assert p.thermal_budget_scale[ThermalStatus.CRITICAL] == 0.1
    assert p.thermal_keep_rank[ThermalStatus.SEVERE] is None
    assert p.thermal_keep_rank[ThermalStatus.CRITICAL] == 300
    assert p.opportunistic_wait_from is ThermalStatus.SEVERE
    assert p.size_bytes[0] == 512
    for bad in (
        {"thermal_budget_scale": {"moderate": 2.0}},
        {"thermal_budget_scale": {"lukewarm": 0.5}},
        {"thermal_keep_rank": {"severe": -5}},
        {"size_bytes": {"0": 0}},
    ):
        with pytest.raises(InvalidArgument):
            ManagerParams.from_config(Config.load(overrides={"policy": bad}))


def test_hot_path_never_scans_the_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """With thousands of requests queued, a request that fits, its load and its unload
    touch only the queue's head (the bench's "p99 at 10,000 queued" target)."""
    import itertools

    from npumanager.service.ranking import RankQueue
    from npumanager.service.state import ManagerState

    ids = itertools.count()
    s = ManagerState(grant_ids=lambda: f"g{next(ids)}")

    def e(cls: type[ev.Event], **kw: object) -> ev.Event:
        return cls(stimulus_id="x", now=1.0, **kw)  # type: ignore[arg-type]

    s.handle(e(ev.ImportanceChanged, uid=FG, importance=100))
    s.handle(e(ev.ImportanceChanged, uid=VIS, importance=200))
    s.handle(e(ev.RequestLoad, uid=VIS, pid=1, conn=VIS, request_id=0, size=MID))
    for i in range(3_000):
        uid = 20_000 + i % 100
        s.handle(e(ev.RequestLoad, uid=uid, pid=1, conn=uid, request_id=i, size=BIG))
    assert s.dump(1.0)["counts"]["queued"] == 3_000

    def boom(*_: object, **__: object) -> None:
        raise AssertionError("the hot path scanned the queue")

    monkeypatch.setattr(RankQueue, "ordered", boom)
    monkeypatch.setattr(ManagerState, "_rebalance", boom)
    monkeypatch.setattr(ManagerState, "_counts", boom)
    pops = 0
    real_peek = RankQueue.peek

    def counting_peek(self: RankQueue) -> object:
        nonlocal pops
        pops += 1
        return real_peek(self)

    monkeypatch.setattr(RankQueue, "peek", counting_peek)
    for rid in range(1, 50):
        out = s.handle(e(ev.RequestLoad, uid=FG, pid=1, conn=FG, request_id=rid))
        assert granted(out) == [(FG, rid)]
        s.handle(e(ev.ModelLoaded, uid=FG, conn=FG, request_id=rid))
        s.handle(e(ev.ModelUnloaded, uid=FG, conn=FG, request_id=rid))
    assert pops <= 2 * 49  # one look at the head per request and per unload
