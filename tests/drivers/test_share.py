"""Fair share among background apps (drivers/share.py) on the driver state's virtual
clock: the uid that used more than its share of background time is the one whose
steps yield. Off (background_share False), no step yields."""

from __future__ import annotations

import pytest

from npumanager.drivers import events as ev
from npumanager.drivers.share import BackgroundShare

from .state_harness import Harness


def step_of(out: list[ev.Instruction], ticket: int) -> ev.RunStep:
    steps = [i for i in out if isinstance(i, ev.RunStep) and i.ticket == ticket]
    assert len(steps) == 1, out
    return steps[0]


@pytest.mark.parametrize("share", [True, False], ids=["share", "off"])
def test_the_llm_that_used_the_background_yields_to_the_embedder(share: bool) -> None:
    h = Harness(channels=3, reserved_channels=1, background_share=share)
    h.priorities(u2=300, u3=300)  # uid 2 an LLM, uid 3 an embedder: equal priority
    llm, emb = h.prepare(2), h.prepare(3)
    llm_ticket, out = h.execute(2, llm, steps=1000)
    assert not step_of(out, llm_ticket).yields  # alone in the background
    for _ in range(50):  # 200 ms of 4 ms decode steps
        h.advance(0.004)
        out = h.step_done(llm_ticket, run_us=4000)
        assert not step_of(out, llm_ticket).yields
    # The embedder's batches come: 0.5 ms steps, one every 2 ms.
    yielded = []
    for _ in range(20):
        ticket, out = h.execute(3, emb)
        assert not step_of(out, ticket).yields  # under its share
        h.advance(0.0005)
        h.step_done(ticket, run_us=500)
        h.advance(0.0015)
        out = h.step_done(llm_ticket, run_us=2000)
        yielded.append(step_of(out, llm_ticket).yields)
    assert all(yielded) is share and any(yielded) is share


def test_shares_follow_recent_use() -> None:
    s = BackgroundShare(half_life_s=0.5, slack=1.25)
    s.note(1, 1.0, now=0.0)
    s.note(2, 0.1, now=0.0)
    assert s.yields(1, 0.0, {1, 2}) and not s.yields(2, 0.0, {1, 2})
    assert s.yields(1, 0.05, ())  # uid 2's step ended 50 ms ago: it is still active
    assert not s.yields(1, 1.0, {1})  # alone: nobody to yield to
    # Five half-lives later uid 1's second of work counts 1/32; uid 2 works on.
    for t in range(1, 26):
        s.note(2, 0.1, now=t * 0.1)
    assert s.yields(2, 2.5, {1, 2}) and not s.yields(1, 2.5, {1, 2})


def test_a_uid_that_stopped_is_forgotten() -> None:
    s = BackgroundShare(half_life_s=0.1)
    s.note(1, 0.01, now=0.0)
    s.note(2, 0.01, now=5.0)
    assert 1 not in s.used
