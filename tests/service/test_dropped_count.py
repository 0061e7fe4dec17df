"""``npu_requests_dropped_total``: a request that never gets a status is counted too.

A request whose client leaves before npud decides its end ends silently (no callback, no
``npu_requests_completed_total``); the pure state emits ``RequestDropped`` for it, once, and
the metrics observer counts it (``reason="client_gone"``). A load request npud refuses
before deciding anything (malformed, invalid, over the per-uid limit) never reaches the
state: the RPC handler reports it to the observers (``on_request_refused``); that path is
tested against a real npud in ``tests/ops/test_metrics_dropped.py``. Virtual clock here."""

from __future__ import annotations

import random
from dataclasses import replace

from prometheus_client import CollectorRegistry

from npumanager.constants import ModelSize, Policy
from npumanager.service import events as ev
from npumanager.service.metrics import COMPLETED, DROPPED, MetricsObserver
from npumanager.service.policy import ManagerParams
from tests.service.state_harness import Harness

BIG = int(ModelSize.GREATER_THAN_2G)  # the whole default budget


def harness(ack_s: float = 10.0) -> tuple[Harness, MetricsObserver]:
    h = Harness(replace(ManagerParams(), grant_end_ack_s=ack_s), policy=Policy.BUDGET,
                drivers=("reference",), auto_ack=False)
    h.driver_up("reference")
    return h, MetricsObserver("default", CollectorRegistry())


def counts(obs: MetricsObserver, h: Harness) -> tuple[dict[str, float], dict[str, float]]:
    """(completed by status, dropped by reason) after feeding every step not fed yet."""
    for event, out in h.log[getattr(obs, "_fed", 0):]:
        obs.on_event(event, out)
    obs._fed = len(h.log)  # type: ignore[attr-defined]
    done = {s: obs.completed.labels("default", s)._value.get() for s in COMPLETED.values()}
    dropped = {r: obs.dropped.labels("default", r)._value.get() for r in DROPPED}
    return done, dropped


def test_a_waiting_request_whose_client_leaves_is_counted_as_dropped() -> None:
    h, obs = harness()
    h.request(1, 1, size=BIG)  # holds the whole budget
    h.request(2, 7, size=BIG)  # waits behind it
    assert h.state_of(2, 7) in ("queued", "waiting")
    out = h.gone(2)
    assert ev.RequestDropped(2, 7, "reference") in out
    assert not any(isinstance(i, ev.RequestEnded | ev.SendComplete) for i in out)
    done, dropped = counts(obs, h)
    assert dropped["client_gone"] == 1 and sum(dropped.values()) == 1
    assert sum(done.values()) == 0
    # Never granted: its load time is forgotten, not kept for a grant that cannot come.
    assert (2, 7) not in obs._asked


def test_a_holder_whose_client_leaves_is_dropped_once_and_not_completed() -> None:
    h, obs = harness()
    h.request(1, 1, size=BIG)
    h.loaded(1, 1)
    out = h.gone(1)
    assert [i for i in out if isinstance(i, ev.RequestDropped)] == [
        ev.RequestDropped(1, 1, "reference")]
    done, dropped = counts(obs, h)
    assert dropped["client_gone"] == 1 and sum(done.values()) == 0
    for g in sorted(h.state._ending):
        h.ack(g)  # the driver applies the end later: nothing more is counted
    assert counts(obs, h) == (done, dropped)


def test_a_request_ended_before_its_client_left_is_not_dropped() -> None:
    """Its end was decided (COMPLETE, the answer waiting for the driver's ack): counted
    there, and the client leaving afterwards drops nothing."""
    h, obs = harness()
    h.request(1, 1, size=BIG)
    h.loaded(1, 1)
    h.unloaded(1, 1)
    out = h.gone(1)
    assert not any(isinstance(i, ev.RequestDropped) for i in out)
    done, dropped = counts(obs, h)
    assert done["complete"] == 1 and sum(dropped.values()) == 0


def test_refusals_are_counted_by_reason() -> None:
    obs = MetricsObserver("default", CollectorRegistry())
    for reason in ("malformed", "invalid", "invalid", "over_limit"):
        obs.on_request_refused(reason)
    got = {r: obs.dropped.labels("default", r)._value.get() for r in DROPPED}
    assert got == {"client_gone": 0, "malformed": 1, "invalid": 2, "over_limit": 1,
                   "error": 0}


def test_every_request_that_left_is_counted_once_as_completed_or_dropped() -> None:
    """A seeded random mix of requests, unloads, cancels, client deaths, late acks and
    deadlines: completed + dropped equals the requests made less those still live, and the
    checker asserts one RequestEnded or one RequestDropped per request, never both."""
    for seed in range(40):
        rng = random.Random(seed)
        h, obs = harness(ack_s=3.0)
        made = 0
        for _ in range(60):
            op = rng.random()
            uid = rng.randint(1, 4)
            live = [k for k in h.state._table.requests if k[0] == uid]
            if op < 0.35:
                made += 1
                h.request(uid, made, size=rng.choice((0, 1, 2, BIG)))
            elif op < 0.45 and live:
                k = rng.choice(live)
                if h.state_of(*k) in ("granted", "loaded", "unload_requested"):
                    h.unloaded(*k)
            elif op < 0.55 and live:
                h.cancel(*rng.choice(live))
            elif op < 0.7:
                h.gone(uid)
            elif op < 0.8 and h.state._ending:
                h.ack(rng.choice(sorted(h.state._ending)))
            else:
                h.advance(rng.uniform(0.1, 4.0))
        done, dropped = counts(obs, h)
        live_now = len(h.state._table.requests)
        assert sum(done.values()) + sum(dropped.values()) == made - live_now, seed
        assert sum(dropped.values()) == dropped["client_gone"], seed
