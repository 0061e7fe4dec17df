"""ManagerState over several devices under random event sequences (hypothesis).

Every step goes through the harness (``validate()`` after each event: per-device
sums, budgets, queues and holders; the lifecycle stream checker), and on top:

* what one request, cancel or unload on device X causes stays on X: every
  unload request and every grant it leads to names X;
* a device's own thermal change asks only that device's holders to unload;
* a grant is issued for the device its request named (or the first device).
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npumanager.constants import LoadStatus, ModelPriority, Policy, ThermalStatus
from npumanager.errors import InvalidArgument, LimitExceeded, UnknownRequest
from npumanager.hal.types import EndReason
from npumanager.service import events as ev
from npumanager.service.policy import ManagerParams

from .state_harness import Harness

UIDS = [0, 1001, 1002, 1003, 1004]
RIDS = [1, 2, 3]
IMPORTANCES = [100, 200, 300, 400, 1000]
DRIVERS = {"ov": ["ov:CPU", "ov:GPU", "ov:NPU"], "ref": ["ref"]}
DEVICES = [d for ds in DRIVERS.values() for d in ds]

uid_st = st.sampled_from(UIDS)
rid_st = st.sampled_from(RIDS)
device_st = st.sampled_from([None, *DEVICES, "nope"])

step_st = st.one_of(
    st.tuples(st.just("request"), uid_st, rid_st, st.integers(0, 2),
              st.sampled_from([int(p) for p in ModelPriority]), device_st),
    st.tuples(st.just("cancel"), uid_st, rid_st),
    st.tuples(st.just("loaded"), uid_st, rid_st),
    st.tuples(st.just("unloaded"), uid_st, rid_st),
    st.tuples(st.just("gone"), uid_st),
    st.tuples(st.just("importance"), uid_st, st.sampled_from(IMPORTANCES)),
    st.tuples(st.just("policy"), st.sampled_from([int(p) for p in Policy]),
              st.one_of(st.none(), st.integers(1, 5))),
    st.tuples(st.just("work"), uid_st, st.sampled_from([None, *DEVICES])),
    st.tuples(st.just("thermal"), st.sampled_from(list(ThermalStatus)),
              st.sampled_from([None, *DEVICES])),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 2.0, 30.0])),
    st.tuples(st.just("memory"), st.integers(0, 3), st.integers(0, 6 << 30)),
    st.tuples(st.just("driver_up"), st.sampled_from(list(DRIVERS)), st.integers(1, 3),
              st.sampled_from([1 << 30, 4 << 30, 16 << 30])),
    st.tuples(st.just("driver_down"), st.sampled_from(list(DRIVERS))),
)


def _devices_named(out: list[ev.Instruction]) -> set[str]:
    return {i.device for i in out
            if isinstance(i, ev.AskUnload | ev.IssueGrant)}


def run(h: Harness, steps: list[tuple[Any, ...]]) -> None:
    s = h.state
    for step in steps:
        kind = step[0]
        try:
            if kind == "request":
                _, uid, rid, size, prio, device = step
                out = h.request(uid, rid, size, prio, device=device)
                dev = s.device_of(uid, rid)
                assert dev == (device or s.devices()[0])
                assert _devices_named(out) <= {dev}, (step, out)
            elif kind in ("cancel", "unloaded"):
                dev = s.device_of(step[1], step[2])
                out = (h.cancel if kind == "cancel" else h.unloaded)(step[1], step[2])
                assert _devices_named(out) <= {dev}, (step, out)
            elif kind == "loaded":
                h.loaded(step[1], step[2])
            elif kind == "gone":
                h.gone(step[1])
            elif kind == "importance":
                h.importance(step[1], step[2])
            elif kind == "policy":
                h.policy(step[1], max_budget=step[2])
            elif kind == "work":
                out = h.completed(step[1], EndReason.COMPLETED, device=step[2])
                if step[2] is not None:
                    assert _devices_named(out) <= {step[2]}, (step, out)
            elif kind == "thermal":
                out = h.thermal(step[1], device=step[2])
                if step[2] is not None:
                    asked = {i.device for i in out if isinstance(i, ev.AskUnload)}
                    assert asked <= {step[2]}, (step, out)
            elif kind == "advance":
                h.advance(step[1])
            elif kind == "memory":
                grants = sorted(g for g, _, _ in s.live_grants())
                g = grants[step[1] % len(grants)] if grants else "none"
                dev = s.grant_devices().get(g)
                out = h.memory(g, step[2])
                assert {i.device for i in out if isinstance(i, ev.AskUnload)} <= {dev}
            elif kind == "driver_up":
                _, driver, n, mem = step
                names = DRIVERS[driver][:n]
                h.driver_up(driver, devices={d: mem for d in names})
            elif kind == "driver_down":
                h.driver_down(step[1])
        except (InvalidArgument, UnknownRequest, LimitExceeded):
            s.validate()  # a refused event changed nothing that breaks invariants
        for g, dev in s.grant_devices().items():
            assert dev in s.devices(), f"grant {g} for a device npud does not know"
    h.advance(3600)
    s.validate()


def _harness(**kw: Any) -> Harness:
    h = Harness(ManagerParams(max_requests_per_uid=3, **kw), drivers=("ov", "ref"))
    # Every device known up front, as npud learns them before it serves clients.
    h.driver_up("ov", devices={d: 8 << 30 for d in DRIVERS["ov"]})
    h.driver_up("ref", 8 << 30)
    return h


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step_st, max_size=60))
def test_random_sequences_over_several_devices_keep_invariants(
        steps: list[tuple[Any, ...]]) -> None:
    run(_harness(), steps)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step_st, max_size=60))
def test_random_sequences_from_placeholders_with_queue_wait(
        steps: list[tuple[Any, ...]]) -> None:
    # Drivers not yet up: requests land on placeholders that become devices later.
    h = Harness(ManagerParams(max_requests_per_uid=3, max_queue_wait_s=10.0,
                              unload_deadline_s=1.0), drivers=("ov", "ref"))
    run(h, steps)


def test_grant_for_one_device_leaves_others_untouched_exactly() -> None:
    h = _harness()
    out = h.request(1001, 1, 2, device="ov:NPU")
    assert [type(i) for i in out] == [ev.IssueGrant, ev.SendCanLoad]
    assert out[1].status == LoadStatus.CAN_LOAD_NOW and out[1].device == "ov:NPU"
    assert {d: h.state.used_on(d) for d in DEVICES} == {
        "ov:CPU": 0, "ov:GPU": 0, "ov:NPU": 4, "ref": 0}
