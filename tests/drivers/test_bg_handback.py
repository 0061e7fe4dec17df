"""A BACKGROUND burst step's run handed back to the burst's own thread
(drivers/bg_handback.py): the protocol alone (every order of the worker's and the burst
thread's moves hands each end to exactly one of them), then the host's shell with a real
SDK client over the real socket: the same records as the ends through drivers/bg_ends.py,
and a burst closed while its step runs still ends the job."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path
from typing import Any

import pytest

from npumanager import nn
from npumanager.drivers.bg_handback import Handback
from npumanager.drivers.steps import Done, Execution
from npumanager.nn.burst import Burst

from .test_burst_shell import burst_served, close
from .test_host_shell import Stack, X, run, uid


class Ends:
    """The fallback (drivers/bg_ends.py's put) and the burst's thread, recorded."""

    def __init__(self) -> None:
        self.fallback: list[tuple[int, str | None, float]] = []

    def put(self, ex: Execution, error: str | None, run_us: float) -> None:
        self.fallback.append((ex.ticket, error, run_us))


def made() -> tuple[Execution, Handback, Ends]:
    ends = Ends()
    ex = Execution(1, None, {}, {}, done=Done())
    return ex, Handback(ends.put), ends


def test_a_run_handed_back_wakes_the_burst_thread_and_the_next_one_can_follow() -> None:
    ex, hb, ends = made()
    assert hb.take() is None  # nothing handed over yet
    hb.ran(ex, None, 10.0)
    assert ex.done is not None and ex.done.wait(0)  # woken
    assert hb.take() == (None, 10.0) and hb.take() is None
    ex.done = Done()  # (as the burst's thread arms it again)
    hb.ran(ex, "boom", 20.0)  # the job's next step
    assert ex.done.wait(0) and hb.take() == ("boom", 20.0)
    assert ends.fallback == []


class Racing(Execution):
    """An execution whose burst thread wakes (its wait's tick) in the middle of the
    worker's ``ran``: at the worker's read of ``done`` it takes whatever result is there
    and, if one was, arms a fresh ``done`` for its next wait, as drivers/burst_exec.py's
    ``_await`` does."""

    hb: Handback

    @property  # type: ignore[override]
    def done(self) -> Done | None:
        if self._done is not None and self.hb.take() is not None:
            self.taken = True
            self._done = Done()
        return self._done

    @done.setter
    def done(self, value: Done | None) -> None:
        self._done = value


def test_a_result_taken_before_the_worker_woke_the_thread_leaves_the_next_wait_armed() -> None:
    ends = Ends()
    ex = Racing(1, None, {}, {}, done=None)
    ex.hb, ex.taken = Handback(ends.put), False
    ex.done = Done()
    first = ex._done
    ex.hb.ran(ex, None, 5.0)
    # The worker read ``done`` before it left the result, so the thread's take at that
    # read found nothing; the wake-up goes to the wait the thread is in.
    assert not ex.taken and first is not None and first.wait(0)
    assert ex.hb.take() == (None, 5.0)
    ex.done = Done()  # (armed again for the job's next step)
    assert ex._done is not None and not ex._done.wait(0)  # the next wait blocks, no spin


def test_a_burst_thread_that_left_first_sends_every_later_end_to_the_fallback() -> None:
    ex, hb, ends = made()
    assert hb.leave() and hb.left
    hb.ran(ex, None, 1.0)
    hb.ran(ex, None, 2.0)
    assert ends.fallback == [(1, None, 1.0), (1, None, 2.0)]
    assert hb.take() is None


def test_a_burst_thread_cannot_leave_while_a_run_is_handed_over() -> None:
    ex, hb, ends = made()
    hb.ran(ex, None, 5.0)
    assert not hb.leave() and not hb.left  # its result is there: it must take it
    assert hb.take() == (None, 5.0)
    assert hb.leave()  # nothing in flight now
    hb.ran(ex, None, 6.0)
    assert ends.fallback == [(1, None, 6.0)]


@pytest.mark.parametrize("seed", range(8))
def test_every_end_is_handled_exactly_once_in_any_order(seed: int) -> None:
    """Seeded random schedules of the two sides' moves: the worker runs steps one after
    another (a job's next step starts only once the last end was recorded); the burst's
    thread takes results, and at some point tries to leave. Each run's end is recorded
    once, by the burst's thread or by the fallback, and none after the thread left is
    taken by it."""
    rng = random.Random(seed)
    ex, hb, ends = made()
    taken: list[float] = []
    runs = 40
    ran_so_far = 0
    recorded = 0  # ends recorded (either side): the next step may start
    pending = False  # a run over, its end not yet recorded
    leave_at = rng.randrange(runs + 5)
    gone = False
    for move in range(10 * runs):
        if ran_so_far == recorded and ran_so_far < runs and rng.random() < 0.5:
            ran_so_far += 1
            hb.ran(ex, None, float(ran_so_far))
            pending = True
            if hb.left:
                recorded += 1  # (the fallback recorded it)
                pending = False
        if not gone:
            got = hb.take()
            if got is not None:
                taken.append(got[1])
                ex.done = Done()
                recorded += 1
                pending = False
            if move >= leave_at and hb.leave():
                gone = True
        if recorded == runs and not pending:
            break
    assert not pending
    fell = [r for _, _, r in ends.fallback]
    assert sorted(taken + fell) == [float(i) for i in range(1, ran_so_far + 1)]
    assert not set(taken) & set(fell)
    if gone and fell:
        assert max(taken, default=0.0) < min(fell)


# --- the host's shell -----------------------------------------------------------------


def records(s: Stack) -> tuple[Any, ...]:
    host, state = s.host, s.host.state
    with host.lock:
        return ([(d.at, d.subject, d.what, d.details) for d in state.decisions()],
                repr(state.stats), [(j.ticket, j.state) for j in state.jobs()],
                state.ledger.held(), sorted(host.res.executions),
                {u: e["executions"] for u, e in host.res.stats.snapshot(0.0)["uids"].items()},
                sorted(k for k, _ in s.pushes))


async def ends_settled(s: Stack, n: int) -> None:
    """Until ``n`` ends went through bg_ends (its thread counts them after submitting)."""
    deadline = time.monotonic() + 60.0
    while s.host.bg_ends.ended < n:
        assert time.monotonic() < deadline, s.host.bg_ends.ended
        await asyncio.sleep(0.002)


def test_a_background_bursts_ends_are_recorded_by_its_thread_the_same_as_through_bg_ends(
        runtime_dir: Path, state_dir: Path) -> None:
    """BACKGROUND burst executions (the test's uid is below the foreground threshold)
    whose steps all run on the lowered workers (inline_run_us = 0): with the handback the
    burst's own thread records each end (bg_ends submits none), without it bg_ends
    submits every one; the state's decisions, counts, jobs, ledger and the reports to
    npud are the same either way."""
    n = 5

    def served_with(handback: bool) -> tuple[Any, ...]:
        got: list[Any] = []

        async def body(s: Stack) -> None:
            async with burst_served(s, runtime_dir, n):
                if not handback:
                    await ends_settled(s, n)
                threads = s.driver.models[0].threads
                assert len(threads) == n and all(t.startswith("npu-gated-bg")
                                                 for t in threads), threads
                got.append((s.host.bg_ends.ended, records(s)))

        run(runtime_dir, state_dir, body, inline_run_us=0, background_handback=handback)
        return tuple(got[0])

    ended_on, with_handback = served_with(True)
    ended_off, without = served_with(False)
    assert (ended_on, ended_off) == (0, n)
    assert with_handback == without


def test_a_burst_closed_while_its_lowered_step_runs_still_ends_the_job(
        runtime_dir: Path, state_dir: Path) -> None:
    """The host closes the burst while its BACKGROUND step blocks on a lowered worker:
    the burst's thread stops waiting (the client gets an error, not a hang), and when
    the step ends its end goes through bg_ends, so the job ends and nothing is left."""

    async def body(s: Stack) -> None:
        await s.grant("g1", uid())
        dev = await asyncio.to_thread(nn.device, "gated", runtime_dir)
        burst: Burst | None = None
        try:
            model = await asyncio.to_thread(dev.prepare_model, b"gated", "g1")
            burst = await asyncio.to_thread(model.burst)
            b = burst

            def execute() -> BaseException | None:
                try:
                    b.execute({"x": X})
                except Exception as exc:  # the burst closed under it
                    return exc
                return None

            call = asyncio.ensure_future(asyncio.to_thread(execute))
            gated = s.driver.models[0]
            assert await asyncio.to_thread(gated.entered.acquire, True, 60.0)
            [server] = list(s.host.bursts._servers.values())
            server.stop()
            # The burst's thread leaves (its thread ends) while the step still runs.
            deadline = time.monotonic() + 60.0
            while server.thread.is_alive():
                assert time.monotonic() < deadline, "the burst's thread kept waiting"
                await asyncio.sleep(0.002)
            assert s.host.bg_ends.ended == 0 and len(s.host.state.jobs()) == 1
            gated.abort()
            await ends_settled(s, 1)
            assert isinstance(await asyncio.wait_for(call, 60.0), Exception)
            assert gated.threads and gated.threads[0].startswith("npu-gated-bg")
            with s.host.lock:
                assert s.host.state.jobs() == [] and s.host.res.executions == {}
        finally:
            await close(burst, dev)

    run(runtime_dir, state_dir, body, inline_run_us=0)
