"""Governor properties on random event sequences (hypothesis), on a virtual clock.

Whatever happens, under every policy:
- no CAN_LOAD_NOW goes to a request ranked above the status's keep-rank, nor to an
  OPPORTUNISTIC request from MODERATE up;
- right after a ThermalChanged, every holder ranked above the keep-rank has been asked
  to unload (state UNLOAD_REQUESTED), with reason THERMAL if this event asked it;
- a waiter that is allowed and fits is not left waiting once the status is NONE and
  nothing holds.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npumanager.constants import LoadStatus, ModelPriority, Policy, ThermalStatus, UnloadReason
from npumanager.service import events as ev
from npumanager.service.policy import DEFAULT_THERMAL_KEEP_RANK

from .test_governor import IMPORTANCE, Gov

UIDS = sorted(IMPORTANCE)
PRIORITIES = [ModelPriority.NORMAL, ModelPriority.BACKGROUND, ModelPriority.OPPORTUNISTIC]

step = st.one_of(
    st.tuples(st.just("request"), st.sampled_from(UIDS), st.sampled_from(PRIORITIES)),
    st.tuples(st.just("loaded"), st.integers(0, 50)),
    st.tuples(st.just("unloaded"), st.integers(0, 50)),
    st.tuples(st.just("thermal"), st.sampled_from(list(ThermalStatus))),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 2.0, 6.0])),
    st.tuples(
        st.just("importance"), st.sampled_from(UIDS), st.sampled_from(sorted(IMPORTANCE.values()))
    ),
)


CURRENT: dict[int, int] = {}


def rank(uid: int, priority: ModelPriority) -> int:
    return CURRENT[uid] + int(priority)


def keep(status: ThermalStatus) -> int | None:
    return DEFAULT_THERMAL_KEEP_RANK[status]


@pytest.mark.slow
@settings(
    max_examples=int(os.environ.get("NPU_HYPOTHESIS_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize="NPU_HYPOTHESIS_EXAMPLES" not in os.environ,
)
@given(
    policy=st.sampled_from([Policy.STATUS_QUO, Policy.TURN_TAKING, Policy.BUDGET, Policy.MEMORY]),
    steps=st.lists(step, min_size=1, max_size=40),
)
def test_governor_never_grants_or_keeps_what_the_status_forbids(
    policy: Policy, steps: list[tuple[Any, ...]]
) -> None:
    g = Gov(policy)
    CURRENT.clear()
    CURRENT.update({u: int(i) for u, i in IMPORTANCE.items()})
    prio: dict[tuple[int, int], ModelPriority] = {}
    next_id = 1

    def check_grants(out: list[ev.Instruction]) -> None:
        status = g.state.thermal_status
        for i in out:
            if isinstance(i, ev.SendCanLoad) and i.status == LoadStatus.CAN_LOAD_NOW:
                p = prio[(i.uid, i.request_id)]
                limit = keep(status)
                r = rank(i.uid, p)
                assert limit is None or r <= limit, f"granted rank {r} at {status.name}"
                assert not (p == ModelPriority.OPPORTUNISTIC and status >= ThermalStatus.MODERATE)

    for s in steps:
        kind = s[0]
        out: list[ev.Instruction] = []
        if kind == "request":
            uid, p = s[1], s[2]
            prio[(uid, next_id)] = p
            out = g.handle(
                ev.RequestLoad, uid=uid, pid=uid, conn=uid, request_id=next_id, priority=p
            )
            next_id += 1
        elif kind in ("loaded", "unloaded"):
            holders = [
                k
                for k in sorted(prio)
                if g.state_of(*k) in ("granted", "loaded", "unload_requested")
                and (kind == "unloaded" or g.state_of(*k) == "granted")
            ]
            if not holders:
                continue
            uid, rid = holders[s[1] % len(holders)]
            cls = ev.ModelLoaded if kind == "loaded" else ev.ModelUnloaded
            out = g.handle(cls, uid=uid, conn=uid, request_id=rid)
        elif kind == "thermal":
            before = {k: g.state_of(*k) for k in prio}
            out = g.thermal(s[1])
            asked = {(i.uid, i.request_id): i.reason for i in out if isinstance(i, ev.AskUnload)}
            limit = keep(s[1])
            for k, p in prio.items():
                st_now = g.state_of(*k)
                if st_now in ("granted", "loaded") and limit is not None:
                    assert rank(k[0], p) <= limit, f"{k} rank {rank(k[0], p)} kept at {s[1].name}"
                if k in asked and before[k] in ("granted", "loaded"):
                    assert asked[k] == UnloadReason.THERMAL
        elif kind == "importance":
            CURRENT[s[1]] = int(s[2])
            out = g.handle(ev.ImportanceChanged, uid=s[1], importance=int(s[2]))
            limit = keep(g.state.thermal_status)
            for k, p in prio.items():
                if g.state_of(*k) in ("granted", "loaded") and limit is not None:
                    assert rank(k[0], p) <= limit, f"{k} kept after its importance fell"
        else:
            out = g.advance(s[1])
        check_grants(out)

    # Cool down and let everyone go: every live request that is allowed gets in.
    out = g.thermal(ThermalStatus.NONE)
    check_grants(out)
    for k in sorted(prio):
        if g.state_of(*k) in ("granted", "loaded", "unload_requested"):
            out = g.handle(ev.ModelUnloaded, uid=k[0], conn=k[0], request_id=k[1])
            check_grants(out)
    for k in sorted(prio):
        state = g.state_of(*k)
        if state in ("queued", "waiting"):
            # Nothing holds any more: a waiter that still waits must be too big or be
            # waiting behind a grant made in this final pass.
            assert g.state.budget_used > 0, f"{k} left {state} with an empty budget"
