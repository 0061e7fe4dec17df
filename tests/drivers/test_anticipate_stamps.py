"""Anticipation's window placed by the client's stamps (drivers/anticipate.py), on a
virtual clock: a client that stamps its requests when it rings them (its own jitter), a
driver that sees each one late (its own, unrelated jitter), and the plan made between
them. Pure: no thread, no sleep; random draws are seeded."""

from __future__ import annotations

import random

import pytest

from npumanager.drivers.anticipate import (
    KEPT,
    MAX_LAG_S,
    MIN_RESIDUALS,
    Anticipation,
)

WINDOW = 300e-6
P30 = 1 / 30


def client_stamps(n: int, period: float, rng: random.Random, start: float = 100.0,
                  late: tuple[float, float] = (20e-6, 160e-6)) -> list[float]:
    """A stream paced by ticks (``tick += period``), each request rung late by a draw
    from ``late`` (a timed sleep that oversleeps, the client's own code)."""
    return [start + i * period + rng.uniform(*late) for i in range(n)]


def run(a: Anticipation, stamps: list[float], rng: random.Random, *, stamped: bool = True,
        seen_late: tuple[float, float] = (70e-6, 250e-6)) -> tuple[int, int, list[float]]:
    """Feed ``stamps`` to ``a`` as the driver would see them (late by ``seen_late``), each
    after a plan made just after the previous one: (planned, held, window lengths), where
    ``held`` counts the requests rung inside their plan's window."""
    planned = held = 0
    lengths = []
    seen = stamps[0]
    for t in stamps:
        plan = a.plan(seen + 1e-3)
        if plan is not None:
            planned += 1
            lengths.append(plan.spin_until - plan.opens)
            held += plan.opens <= t <= plan.spin_until
        seen = t + rng.uniform(*seen_late)
        a.arrived(seen, t if stamped else None)
    return planned, held, lengths


def test_the_clients_stamps_place_the_window_where_its_requests_come() -> None:
    """Same stream, same driver lateness: placed by the stamps, the window holds nearly
    every request; placed by when the driver saw them (its lateness in the times it
    learns from), far fewer. Either way no window is longer than the bound."""
    stamps = client_stamps(400, P30, random.Random(1))
    by_stamp = run(Anticipation(WINDOW), stamps, random.Random(2))
    by_seen = run(Anticipation(WINDOW), stamps, random.Random(2), stamped=False)
    planned, held, lengths = by_stamp
    assert planned >= 380 and held >= 0.9 * planned
    assert by_seen[1] < 0.8 * by_seen[0] and held > by_seen[1]
    assert max(lengths + by_seen[2]) <= WINDOW + 1e-12


def test_a_stream_that_arrives_on_time_polls_for_less_than_the_bound() -> None:
    """Requests within 10 µs of their tick: the window ends soon after the last of them
    (the bound is a ceiling, not the length), and still holds them."""
    stamps = client_stamps(200, P30, random.Random(3), late=(30e-6, 40e-6))
    planned, held, lengths = run(Anticipation(WINDOW), stamps, random.Random(4))
    assert held >= planned - 1
    assert max(lengths[KEPT + MIN_RESIDUALS + 2:]) <= 0.35 * WINDOW


def test_a_stall_and_a_pace_change_are_learnt_anew() -> None:
    rng = random.Random(5)
    a = Anticipation(WINDOW)
    stamps = client_stamps(60, P30, rng)
    run(a, stamps, rng)
    assert a.period == pytest.approx(P30, rel=0.01)
    kept = list(a.residuals)
    # A one-second stall: no window until KEPT intervals agree again, and the gap is not
    # kept as an offset from the due time.
    later = client_stamps(KEPT + 1, P30, rng, start=stamps[-1] + 1.0)
    seen = later[0] + 100e-6
    a.arrived(seen, later[0])
    assert a.period is None and a.plan(seen) is None and a.residuals == kept
    for t in later[1:]:
        a.arrived(t + 100e-6, t)
    assert a.period == pytest.approx(P30, rel=0.01)
    # 30 Hz -> 100 Hz: no window until the new pace is steady, then windows that hold it.
    faster = client_stamps(120, 0.01, rng, start=later[-1] + 0.01)
    a.arrived(faster[0] + 100e-6, faster[0])
    assert a.period is None
    planned, held, _ = run(a, faster[1:], rng)
    assert a.period == pytest.approx(0.01, rel=0.01)
    assert planned >= 100 and held >= 0.85 * planned


@pytest.mark.parametrize("seed", range(4))
def test_garbage_stamps_cost_only_their_own_window_and_never_a_longer_poll(seed: int
                                                                           ) -> None:
    """A hostile client writes anything into its stamps: zero, the future, 2**64-1 ns,
    stamps that go back, random times within the lag that is believed. Its window may be
    anywhere or nowhere, but never longer than the bound; impossible stamps are not
    believed (the time seen stands in)."""
    rng = random.Random(seed)
    a = Anticipation(WINDOW)
    seen = 100.0
    lengths = []
    for i in range(600):
        seen += P30 + rng.uniform(0, 300e-6)
        kind = i % 6
        stamp = (0.0, seen + rng.uniform(1e-6, 1e3), (2**64 - 1) / 1e9,
                 seen - MAX_LAG_S - rng.uniform(1e-6, 1.0),
                 seen - rng.uniform(0, MAX_LAG_S), seen - 50e-6)[kind]
        a.arrived(seen, stamp)
        plan = a.plan(seen + rng.uniform(0, P30))
        if plan is not None:
            lengths.append(plan.spin_until - plan.opens)
    assert a.unstamped >= 4 * 100  # zero, future, overflow, too old: never believed
    assert all(length <= WINDOW + 1e-12 for length in lengths)


def test_stamps_that_do_not_move_forward_are_not_believed() -> None:
    a = Anticipation(WINDOW)
    a.arrived(10.0, 9.9999)
    a.arrived(10.1, 9.9999)  # the same stamp again: the time seen stands in
    a.arrived(10.2, 10.05)  # before the last believed time (10.1): not believed
    assert (a.stamped, a.unstamped) == (1, 2)
    assert a.last == 10.2
