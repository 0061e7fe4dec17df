"""ManagerState: budget policies, ranking, victims, opportunistic requests and fairness
(virtual time)."""

from __future__ import annotations

import pytest

from npumanager.constants import (
    Importance,
    LoadStatus,
    Policy,
    RequestStatus,
    UnloadReason,
)
from npumanager.errors import InvalidArgument
from npumanager.hal.types import EndReason, SchedulingConfig
from npumanager.service import events as ev

from .state_harness import (
    BG,
    BGP,
    BIG,
    CACHED,
    FG,
    MID,
    OPP,
    SMALL,
    VIS,
    Harness,
    budget,
    completes,
    granted,
    status_of,
    unloads,
)

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
        ev.RequestDropped,  # for metrics (npu_requests_dropped_total): no callback
    }
    dropped = [i for i in out if isinstance(i, ev.RequestDropped)]
    assert sorted((i.uid, i.request_id) for i in dropped) == [(BG, 1), (BG, 2), (BG, 3)]
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
