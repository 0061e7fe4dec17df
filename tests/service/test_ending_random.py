"""The driver's ack of a grant's end arrives at random times (at once, later, after npud's
deadline, never), the driver hangs, is restarted, crashes and comes back, apps come, unload,
cancel and die: on virtual time, seeded, the pure npud core against a simulated driver that
holds each grant's memory until it has applied the grant's end.

Checked after every step:

* memory is never granted again before the driver applied the end: what the driver still
  holds (live grants and ended grants it has not applied) never exceeds the budget;
* no grant stays in ``ending`` past its bound: ``grant_end_ack_s`` on npud's own clock,
  and ``npu chaos``'s check (testing/chaos_checks.py) finds nothing.
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field, replace
from typing import Any

from npumanager.config import Config
from npumanager.constants import ModelSize, Policy
from npumanager.service import events as ev
from npumanager.service.policy import ManagerParams
from npumanager.testing.chaos_checks import ending_bound_s, ending_problems
from tests.service.state_harness import Harness

ACK_S = 2.0
BACKOFF_S = 0.5  # the simulated supervisor's restart delay
DRIVER = "reference"


@dataclass
class SimDriver:
    """What the driver process holds, and when its messages reach npud."""

    rng: random.Random
    up: bool = True
    #: grant id -> charge, for every grant whose models the driver may still run.
    held: dict[str, int] = field(default_factory=dict)
    #: (due, seq, kind, grant id): acks in flight, the driver going down and coming back.
    due: list[tuple[float, int, str, str]] = field(default_factory=list)
    seq: Any = field(default_factory=itertools.count)
    #: Ended grants the driver is still applying (it drops them when it applies them).
    applying: set[str] = field(default_factory=set)
    acks: int = 0
    late: int = 0
    restarts: int = 0

    def at(self, when: float, kind: str, grant: str = "") -> None:
        heapq.heappush(self.due, (when, next(self.seq), kind, grant))

    def feed(self, h: Harness, out: list[ev.Instruction]) -> None:
        for ins in out:
            if isinstance(ins, ev.IssueGrant):
                if self.up:
                    self.held[ins.grant_id] = h.state._table.requests[
                        (ins.uid, ins.request_id)].charge
            elif isinstance(ins, ev.EndGrant):
                if not ins.ack:
                    self.held.pop(ins.grant_id, None)  # nothing to wait for: applied at once
                    continue
                self.applying.add(ins.grant_id)
                r = self.rng.random()
                if r < 0.15:
                    continue  # hung on this one: never acknowledged
                delay = (0.0 if r < 0.35 else self.rng.uniform(0.0, ACK_S) if r < 0.85
                         else self.rng.uniform(ACK_S, 2 * ACK_S))  # late: after the deadline
                self.at(h.now + delay, "ack", ins.grant_id)
            elif isinstance(ins, ev.RestartDriver):
                self.kill(h)
                self.restarts += 1

    def kill(self, h: Harness) -> None:
        """Killed (by npud or a crash): it holds nothing; npud hears of it, then it is back."""
        self.up = False
        self.held.clear()
        self.applying.clear()
        self.due = [d for d in self.due if d[2] != "ack"]  # its acks die with it
        heapq.heapify(self.due)
        self.at(h.now + 0.01, "down")
        self.at(h.now + BACKOFF_S, "up")

    def deliver(self, h: Harness, kind: str, grant: str) -> list[ev.Instruction]:
        if kind == "ack":
            if not self.up or grant not in self.applying:
                return []
            # Applied: the models are released, then the ack goes out.
            self.applying.discard(grant)
            self.held.pop(grant, None)
            self.acks += 1
            if grant not in h.state._ending:
                self.late += 1  # npud gave up on it already: the ack changes nothing
            return h.ack(grant, DRIVER)
        if kind == "down":
            return h.driver_down(DRIVER)
        self.up = True
        # npud re-sends its live grants to the driver that came back.
        self.held = {g: h.state._table.requests[(u, r)].charge
                     for g, u, r in h.state.live_grants()}
        return h.driver_up(DRIVER)


def advance(h: Harness, d: SimDriver, dt: float) -> None:
    """Move virtual time, npud's timers and the driver's messages interleaved in order."""
    end = h.now + dt
    while d.due and d.due[0][0] <= end:
        when, _s, kind, grant = heapq.heappop(d.due)
        d.feed(h, h.advance(max(0.0, when - h.now)))
        d.feed(h, d.deliver(h, kind, grant))
        check(h, d)
    d.feed(h, h.advance(end - h.now))


BOUND = ending_bound_s(Config.load(overrides={"manager": {"grant_end_ack_s": ACK_S}}))


def check(h: Harness, d: SimDriver) -> None:
    dump = h.state.dump(h.now)
    total = dump["budget"]["total"]
    held = sum(d.held.values())
    assert held <= total, f"driver holds {held} > budget {total}: {d.held}"
    for e in dump["ending"]:
        assert e["waiting_s"] <= ACK_S + 1e-9, e
    assert ending_problems(dump, BOUND) == []


def run(seed: int, steps: int = 150) -> SimDriver:
    rng = random.Random(seed)
    h = Harness(replace(ManagerParams(), grant_end_ack_s=ACK_S, unload_deadline_s=1.0),
                policy=Policy.BUDGET, drivers=(DRIVER,), auto_ack=False)
    d = SimDriver(rng)
    d.feed(h, h.driver_up(DRIVER))
    for uid, imp in ((1, 100), (2, 200), (3, 300), (4, 400)):
        h.importance(uid, imp)
    rid = itertools.count(1)
    sizes = [int(s) for s in ModelSize]
    for _ in range(steps):
        op = rng.random()
        uid = rng.randint(1, 4)
        mine = [k for k in h.state._table.requests if k[0] == uid]
        state = {k: h.state_of(*k) for k in mine}
        holding = [k for k, s in state.items() if s in ("granted", "loaded",
                                                         "unload_requested")]
        if op < 0.3:
            d.feed(h, h.request(uid, next(rid), size=rng.choice(sizes)))
        elif op < 0.4 and holding:
            d.feed(h, h.loaded(*rng.choice(holding)))
        elif op < 0.55 and holding:
            d.feed(h, h.unloaded(*rng.choice(holding)))
        elif op < 0.62 and mine:
            d.feed(h, h.cancel(*rng.choice(mine)))
        elif op < 0.67:
            d.feed(h, h.gone(uid))
        elif op < 0.7 and d.up:
            d.kill(h)  # the driver crashes
        else:
            advance(h, d, rng.uniform(0.05, 1.5))
        check(h, d)
    advance(h, d, 4 * ACK_S)  # everything in flight lands
    assert h.state._ending == {} or not d.up
    return d


def test_a_randomly_late_ack_never_frees_memory_early_nor_leaves_a_grant_ending() -> None:
    totals = {"acks": 0, "late": 0, "restarts": 0}
    for seed in range(60):
        d = run(seed)
        totals["acks"] += d.acks
        totals["late"] += d.late
        totals["restarts"] += d.restarts
    # The runs reached every kind of ack: on time, after npud gave up, and none (restart).
    print(totals)
    assert totals["acks"] > 100 and totals["late"] > 0 and totals["restarts"] > 0, totals


def test_the_check_flags_a_grant_past_its_bound() -> None:
    """The chaos check itself: over the bound is a violation, within it is not."""
    dump = {"ending": [{"grant": "abcd1234", "uid": 7, "request_id": 3, "waiting_s": 21.0}]}
    cfg = Config.load(overrides={"manager": {"grant_end_ack_s": 10.0}})
    assert ending_bound_s(cfg) == 20.0  # 10 s for the ack, 10 s the default longest back-off
    [(grant, what)] = ending_problems(dump, ending_bound_s(cfg))
    assert grant == "abcd1234" and "uid 7" in what and "21.0 s > 20 s" in what
    dump["ending"][0]["waiting_s"] = 19.9
    assert ending_problems(dump, ending_bound_s(cfg)) == []
