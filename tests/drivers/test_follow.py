"""The follow-on poll after a BACKGROUND burst answer (``background_follow_us``,
drivers/follow.py): pure on given times, and in the host's shell with the real SDK."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from npumanager import nn
from npumanager.drivers import burst_counters as bc
from npumanager.drivers.follow import KEPT, MARGIN, FollowOn
from npumanager.nn.burst import Burst

from .test_burst_shell import close, served
from .test_host_shell import Stack, X, run, uid


def stream(fo: FollowOn, gaps_us: list[float], t0: float = 100.0) -> float:
    """Answers each followed by a request ``gap`` µs later (stamped at its ring, seen
    20 µs after it); the time of the last answer."""
    t = t0
    for gap in gaps_us:
        fo.answered_at(t)
        rung = t + gap / 1e6
        fo.arrived(rung + 20e-6, rung)
        t = rung + 300e-6  # its run, then the next answer
    fo.answered_at(t)
    return t


def test_a_back_to_back_stream_is_polled_for_margin_times_its_median_gap() -> None:
    fo = FollowOn(500e-6)
    assert fo.poll_s() == 0.0  # nothing known yet
    stream(fo, [100.0] * (KEPT - 1))
    assert fo.poll_s() == 0.0  # KEPT gaps needed
    stream(fo, [100.0] * KEPT)
    assert fo.poll_s() == pytest.approx(MARGIN * 100e-6)
    # Never longer than the configured window.
    stream(fo, [400.0] * KEPT)
    assert fo.poll_s() == pytest.approx(500e-6)


def test_a_paced_or_stopped_stream_polls_nothing() -> None:
    fo = FollowOn(500e-6)
    stream(fo, [33_000.0] * (2 * KEPT))  # a 30 Hz camera
    assert fo.poll_s() == 0.0
    # A back-to-back stream that then sleeps between requests: polled no more once
    # half of its kept gaps are long.
    fo = FollowOn(500e-6)
    stream(fo, [100.0] * KEPT)
    assert fo.poll_s() > 0
    stream(fo, [100.0] * KEPT + [20_000.0] * (KEPT // 2))
    assert fo.poll_s() == 0.0
    # Off: never.
    off = FollowOn(0.0)
    stream(off, [100.0] * KEPT)
    assert off.poll_s() == 0.0


def test_a_stamp_outside_answer_to_seen_is_not_believed() -> None:
    fo = FollowOn(500e-6)
    fo.answered_at(10.0)
    fo.arrived(10.0002, 9.0)  # rung before the answer: the time seen stands in
    fo.arrived(10.0003, 11.0)  # rung after it was seen: the same
    assert fo.gaps == [pytest.approx(200e-6), pytest.approx(300e-6)]
    # A request after a FOREGROUND answer (answered at 0) is no gap.
    fo.answered_at(0.0)
    fo.arrived(12.0, 12.0)
    assert len(fo.gaps) == 2


def _executions(s: Stack, runtime_dir: Path, n: int, pause_s: float) -> Burst:
    """``n`` executions through one burst from one thread, ``pause_s`` between them."""
    dev = nn.device("gated", runtime_dir)
    model = dev.prepare_model(b"cheap", "g1")
    burst = model.burst()
    _more(burst, n, pause_s)
    burst._dev = dev  # type: ignore[attr-defined]  # (closed by the caller)
    return burst


def _more(burst: Burst, n: int, pause_s: float) -> None:
    """``n`` more executions through ``burst`` (as :func:`_executions`)."""
    for i in range(n):
        out = burst.execute({"x": X + i})
        np.testing.assert_array_equal(out["y"], X + i + 1)
        if pause_s:
            time.sleep(pause_s)


@pytest.mark.alone  # (a loaded machine stretches the 0.5 ms stream's gaps)
@pytest.mark.parametrize("pause_s", [0.0005, 0.03])
def test_the_host_follows_a_back_to_back_background_stream_only(
        runtime_dir: Path, state_dir: Path, pause_s: float) -> None:
    """With background_follow_us, a BACKGROUND burst's thread polls after its answers
    while the app calls again within the window (its next requests found by the poll:
    the app pauses 0.5 ms, so that the thread is waiting when they come, where a
    client in this process would have written it before), and never for an app that
    pauses 30 ms between calls. A window of 5 ms: the app's own time between two calls
    stays inside it on a loaded machine.

    The poll lasts 1.5x the stream's median gap (follow.MARGIN): where the test runs
    beside CPU-bound neighbours, the app's thread can miss every poll of a stream (seen
    once: polls, none found). So the 0.5 ms stream goes on, on the same burst, for up to
    four rounds of 3 * KEPT calls until a poll has found a request; the 30 ms stream must
    never be followed in its one round."""
    n = 3 * KEPT
    rounds = 4 if pause_s < 0.01 else 1

    async def body(s: Stack) -> None:
        await s.grant("g1", uid())
        burst = await asyncio.to_thread(_executions, s, runtime_dir, n, pause_s)
        try:
            await served(s, n)
            [server] = list(s.host.bursts._servers.values())
            c = server.counters
            assert server.follow is not None
            for done in range(2, rounds + 1):
                if c.found[bc.FOLLOWED] > 0:
                    break
                await asyncio.to_thread(_more, burst, n, pause_s)
                await served(s, done * n)
            if pause_s > 0.01:
                assert c.follows == 0 and c.found[bc.FOLLOWED] == 0, c
            else:
                assert c.follows > 0
                assert c.found[bc.FOLLOWED] > 0, c.found
                # (the thread may be in a poll after the last answer still)
                assert 0 <= c.follows - c.found[bc.FOLLOWED] - c.follow_expired <= 1
        finally:
            await close(burst, burst._dev)  # type: ignore[attr-defined]

    run(runtime_dir, state_dir, body, inline_run_us=0, background_burst_here="normal",
        background_follow_us=5000)


def test_off_by_default(runtime_dir: Path, state_dir: Path) -> None:
    async def body(s: Stack) -> None:
        await s.grant("g1", uid())
        burst = await asyncio.to_thread(_executions, s, runtime_dir, 2 * KEPT, 0.0)
        try:
            await served(s, 2 * KEPT)
            [server] = list(s.host.bursts._servers.values())
            assert server.follow is None and server.counters.follows == 0
        finally:
            await close(burst, burst._dev)  # type: ignore[attr-defined]

    run(runtime_dir, state_dir, body, inline_run_us=0, background_burst_here="normal")
