"""ManagerState under random event sequences (hypothesis).

Every step goes through the harness, so after each event ``validate()`` holds
and every request's instruction stream is checked against the legal lifecycle
(answers before the grant, IssueGrant right before CAN_LOAD_NOW, at most one
unload request, exactly one EndGrant per grant before the terminal status,
nothing after it, silence for a dead client).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npumanager.constants import ModelPriority, Policy, ThermalStatus
from npumanager.errors import InvalidArgument, LimitExceeded, UnknownRequest
from npumanager.hal.types import EndReason
from npumanager.service.policy import ManagerParams

from .state_harness import Harness

UIDS = [0, 1001, 1002, 1003, 1004]
RIDS = [1, 2, 3, 4]
CONNS = {uid: [uid * 10, uid * 10 + 1] for uid in UIDS}
IMPORTANCES = [100, 125, 200, 230, 300, 400, 1000]

uid_st = st.sampled_from(UIDS)
rid_st = st.sampled_from(RIDS)

step_st = st.one_of(
    st.tuples(
        st.just("request"),
        uid_st,
        rid_st,
        st.integers(0, 2),
        st.sampled_from([int(p) for p in ModelPriority]),
        st.integers(0, 1),
    ),
    st.tuples(st.just("cancel"), uid_st, rid_st),
    st.tuples(st.just("loaded"), uid_st, rid_st),
    st.tuples(st.just("unloaded"), uid_st, rid_st),
    st.tuples(st.just("gone"), uid_st, st.integers(0, 1)),
    st.tuples(st.just("importance"), uid_st, st.sampled_from(IMPORTANCES)),
    st.tuples(
        st.just("policy"),
        st.sampled_from([int(p) for p in Policy] + [7]),
        st.one_of(st.none(), st.integers(-1, 6)),
        st.one_of(st.none(), st.dictionaries(st.integers(0, 2), st.integers(0, 4), max_size=3)),
    ),
    st.tuples(st.just("work"), uid_st, st.sampled_from(list(EndReason))),
    st.tuples(st.just("thermal"), st.sampled_from(list(ThermalStatus))),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 2.0, 5.0, 30.0])),
    st.tuples(st.just("memory"), st.integers(0, 3), st.integers(0, 6 << 30)),
    st.tuples(st.just("driver"), st.booleans(), st.sampled_from([0, 2 << 30, 8 << 30])),
)


def run(h: Harness, steps: list[tuple[Any, ...]]) -> None:
    for step in steps:
        kind = step[0]
        try:
            if kind == "request":
                _, uid, rid, size, prio, c = step
                h.request(uid, rid, size, prio, conn=CONNS[uid][c])
            elif kind == "cancel":
                h.cancel(step[1], step[2])
            elif kind == "loaded":
                h.loaded(step[1], step[2])
            elif kind == "unloaded":
                h.unloaded(step[1], step[2])
            elif kind == "gone":
                h.gone(CONNS[step[1]][step[2]])
            elif kind == "importance":
                h.importance(step[1], step[2])
            elif kind == "policy":
                h.policy(step[1], max_budget=step[2], weights=step[3])
            elif kind == "work":
                h.completed(step[1], step[2])
            elif kind == "thermal":
                h.thermal(step[1])
            elif kind == "advance":
                h.advance(step[1])
            elif kind == "memory":
                grants = sorted(g for g, _, _ in h.state.live_grants())
                h.memory(grants[step[1] % len(grants)] if grants else "none", step[2])
            elif kind == "driver":
                if step[1]:
                    h.driver_up("npu0", step[2])
                else:
                    h.driver_down("npu0")
        except (InvalidArgument, UnknownRequest, LimitExceeded):
            h.state.validate()  # a refused event changed nothing that breaks invariants
    # Drain: time passes, everyone unloads what they were asked to; all ends well.
    h.advance(3600)
    h.state.validate()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step_st, max_size=60))
def test_random_event_sequences_keep_invariants(steps: list[tuple[Any, ...]]) -> None:
    run(Harness(ManagerParams(max_requests_per_uid=3)), steps)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step_st, max_size=60))
def test_random_sequences_with_queue_wait_and_short_deadline(
    steps: list[tuple[Any, ...]],
) -> None:
    run(Harness(ManagerParams(max_queue_wait_s=10.0, unload_deadline_s=1.0)), steps)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step_st, max_size=40))
def test_everyone_leaving_empties_the_state(steps: list[tuple[Any, ...]]) -> None:
    h = Harness()
    run(h, steps)
    for uid in UIDS:
        for conn in CONNS[uid]:
            h.gone(conn)
    assert h.state.live_grants() == []
    assert h.state.budget_used == 0
    assert h.state.dump(h.now)["requests"] == []


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step_st, max_size=120))
def test_long_random_event_sequences_keep_invariants(steps: list[tuple[Any, ...]]) -> None:
    run(Harness(ManagerParams(max_requests_per_uid=3, max_queue_wait_s=20.0)), steps)
