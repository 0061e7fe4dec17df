"""``npu_requests_completed_total`` counts a request when its terminal state is decided
(RequestEnded), not when its answer is sent: an answer that waits for the driver's ack
(service/ending.py) may never go out, its client gone by then. On virtual time, the
metrics observer fed exactly what the pure state emitted."""

from __future__ import annotations

import random
from dataclasses import replace

from prometheus_client import CollectorRegistry

from npumanager.constants import ModelSize, Policy, RequestStatus
from npumanager.service import events as ev
from npumanager.service.metrics import COMPLETED, MetricsObserver
from npumanager.service.policy import ManagerParams
from tests.service.state_harness import Harness

BIG = int(ModelSize.GREATER_THAN_2G)  # the whole default budget


def counted(obs: MetricsObserver, h: Harness) -> dict[str, float]:
    """Feed the observer every (event, instructions) the harness saw so far, once."""
    for event, out in h.log[getattr(obs, "_fed", 0):]:
        obs.on_event(event, out)
    obs._fed = len(h.log)  # type: ignore[attr-defined]
    return {s: obs.completed.labels("default", s)._value.get() for s in COMPLETED.values()}


def harness(ack_s: float = 10.0) -> tuple[Harness, MetricsObserver]:
    h = Harness(replace(ManagerParams(), grant_end_ack_s=ack_s), policy=Policy.BUDGET,
                drivers=("reference",), auto_ack=False)
    h.driver_up("reference")
    return h, MetricsObserver("default", CollectorRegistry())


def test_a_client_gone_before_the_drivers_ack_is_counted_once() -> None:
    h, obs = harness()
    h.request(1, 1, size=BIG)
    h.loaded(1, 1)
    out = h.unloaded(1, 1)
    [end] = [i for i in out if isinstance(i, ev.EndGrant)]
    assert end.ack and not any(isinstance(i, ev.SendComplete) for i in out)
    # Counted at the decision, before the answer (which waits for the driver).
    assert counted(obs, h)["complete"] == 1
    h.gone(1)  # the client leaves while its grant waits for the driver's ack
    out = h.ack(end.grant_id)
    assert not any(isinstance(i, ev.SendComplete) for i in out)  # nobody to answer
    assert counted(obs, h) == {"cancelled": 0, "complete": 1, "revoked": 0}


def test_a_client_gone_before_a_driver_restart_is_counted_once() -> None:
    """The ack never comes: the driver is restarted and the end applied; still one."""
    h, obs = harness(ack_s=2.0)
    h.request(1, 1, size=BIG)
    h.advance(0.5)
    h.cancel(1, 1)  # CANCELLED while granted: waits for the driver too
    h.gone(1)
    out = h.advance(2.0)
    assert [type(i) for i in out][:1] == [ev.RestartDriver]
    assert counted(obs, h) == {"cancelled": 1, "complete": 0, "revoked": 0}


def test_every_decided_end_is_counted_exactly_once_whatever_the_order() -> None:
    """A seeded random mix of requests, unloads, cancels, client deaths, late acks, driver
    restarts and deadlines: the counter equals the number of requests whose end was decided
    with a status, and every answer sent was counted (the checker asserts one decision per
    request)."""
    for seed in range(40):
        rng = random.Random(seed)
        h, obs = harness(ack_s=3.0)
        rid = 0
        for _ in range(60):
            op = rng.random()
            uid = rng.randint(1, 4)
            live = [k for k in h.state._table.requests if k[0] == uid]
            if op < 0.3:
                rid += 1
                h.request(uid, rid, size=rng.choice((0, 1, 2, BIG)))
            elif op < 0.45 and live:
                k = rng.choice(live)
                if h.state_of(*k) in ("granted", "loaded", "unload_requested"):
                    h.unloaded(*k)
            elif op < 0.55 and live:
                h.cancel(*rng.choice(live))
            elif op < 0.65:
                h.gone(uid)
            elif op < 0.8 and h.state._ending:
                h.ack(rng.choice(sorted(h.state._ending)))
            else:
                h.advance(rng.uniform(0.1, 4.0))
        decided = [i for _e, out in h.log for i in out if isinstance(i, ev.RequestEnded)]
        answered = [i for _e, out in h.log for i in out if isinstance(i, ev.SendComplete)]
        assert len({(i.uid, i.request_id) for i in decided}) == len(decided), seed
        assert {(i.uid, i.request_id, i.status) for i in answered} <= {
            (i.uid, i.request_id, i.status) for i in decided}, seed
        by_status = counted(obs, h)
        assert sum(by_status.values()) == len(decided), seed
        for status in RequestStatus:
            if status in COMPLETED:
                assert by_status[COMPLETED[status]] == sum(
                    1 for i in decided if i.status == status), seed
