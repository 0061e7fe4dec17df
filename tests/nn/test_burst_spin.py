"""The burst's spin for its answer (nn/burst_spin.py): fixed, never, or the SDK's default,
adaptive, which spins only while the stream runs back to back, bounded by its own answer
times; pure on given times, then through a real driver host."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from npumanager import nn
from npumanager.errors import InvalidArgument
from npumanager.nn import burst_spin
from npumanager.nn.burst_spin import EVERY, KEPT, MARGIN, MAX_S, MISSES, RETRY, TOOK, Spin
from npumanager.testing.driver_host import running_driver
from npumanager.testing.onnx_models import add_model


def stream(spin: Spin, n: int, gap_s: float, blocked_s: float,
           spun_s: float | None = None, t: float = 100.0) -> list[float]:
    """``n`` executions: the app calls ``gap_s`` after the last returned; its answer
    comes ``blocked_s`` after the ring when it blocks, ``spun_s`` when it spins (None:
    as blocked; caught when it comes within the spin). Each execution's spin, s."""
    spans = []
    for _ in range(n):
        t += gap_s
        spin.called(t)
        span = spin.window()
        spans.append(span)
        took = blocked_s if not span or spun_s is None else spun_s
        spin.answered(took, span > 0, span > 0 and took <= span)
        t += took
        spin.done(t)
    return spans


def test_adaptive_spins_where_spinning_answers_sooner_bounded_by_its_answers() -> None:
    spin = Spin(None)
    assert spin.window() == 0.0  # nothing known yet
    # KEPT gaps first (the first call has none before it), then TOOK blocked executions
    # (the baseline), then TOOK spun ones (the trial).
    spans = stream(spin, KEPT + TOOK, 20e-6, 400e-6, 250e-6)
    assert spans == [0.0] * (KEPT + TOOK)
    spans = stream(spin, TOOK, 20e-6, 400e-6, 250e-6)
    assert spans[0] == pytest.approx(MARGIN * 400e-6)  # the answers' median so far
    assert all(s > 0 for s in spans) and spin.spinning
    # Spun answers kept coming sooner: it spins, the blocked mode tried TOOK times per
    # EVERY executions.
    spans = stream(spin, 2 * EVERY, 20e-6, 400e-6, 250e-6)
    assert spin.spinning and TOOK <= sum(1 for s in spans if s == 0) <= 2 * TOOK
    assert spin.caught == spin.spun
    # The spin's bound: MARGIN x the median answer, never more than MAX_S.
    stream(spin, EVERY, 20e-6, 5e-3, 4e-3)
    assert 0 < spin.window() <= MAX_S


def test_adaptive_blocks_where_spinning_answers_later() -> None:
    """A driver whose step runs on a SCHED_IDLE worker answers a spinning app later
    than a blocked one: the stream stops spinning after its trial, and spins only in
    the trial of TOOK executions every EVERY."""
    spin = Spin(None)
    spans = stream(spin, KEPT + 2 * TOOK + 4 * EVERY, 20e-6, 600e-6, 800e-6)
    assert not spin.spinning
    # The first trial, then one of TOOK per EVERY blocked executions or so.
    assert TOOK * 4 <= sum(1 for s in spans if s > 0) <= TOOK * 5


def test_adaptive_never_spins_for_a_paced_or_stopped_stream() -> None:
    spin = Spin(None)
    spans = stream(spin, 3 * EVERY, 1 / 30, 800e-6, 100e-6)  # a 30 Hz camera
    assert spans == [0.0] * (3 * EVERY) and spin.took == ([], [])
    # Back to back and spinning, then calls that come 20 ms apart: no spin once half of
    # the kept gaps are long.
    spin = Spin(None)
    stream(spin, KEPT + 2 * TOOK, 20e-6, 400e-6, 250e-6)
    assert spin.window() > 0
    spans = stream(spin, EVERY, 0.02, 400e-6, 250e-6)
    assert spans[KEPT // 2 + 1:] == [0.0] * (EVERY - KEPT // 2 - 1)


def test_fixed_and_never() -> None:
    assert Spin(0).window() == 0.0
    never = Spin(0)
    stream(never, 2 * EVERY, 20e-6, 300e-6, 100e-6)
    assert never.window() == 0.0 and never.spun == 0 and never.gaps == []
    assert Spin(700).window() == pytest.approx(700e-6)


def test_a_fixed_spin_that_misses_blocks_then_tries_again() -> None:
    spin = Spin(700)
    for _ in range(MISSES):
        assert spin.window() > 0
        spin.answered(5e-3, True, False)  # the answer came after the spin
    blocked = 0
    while spin.window() == 0.0:
        blocked += 1
        assert blocked < RETRY
    assert blocked == RETRY - MISSES
    spin.answered(100e-6, True, True)
    assert spin.misses == 0 and spin.caught == 1 and spin.spun == MISSES + 1


def test_spin_polls_until_ready_or_its_span() -> None:
    spin = Spin(None)
    looks = iter([False, False, True])
    assert spin.spin(10.0, lambda: next(looks)) is True
    assert spin.spin(0.0, lambda: False) is False


def test_a_negative_spin_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="spin_us"):
        burst_spin_check(-1.0)


def burst_spin_check(spin_us: float) -> None:
    from npumanager.nn.burst import Burst

    Burst(None, spin_us=spin_us)  # type: ignore[arg-type]  # (refused before any use)


# --- through a driver host -------------------------------------------------------------

@pytest.fixture
def reference(runtime_dir: Path, state_dir: Path) -> Iterator[Path]:
    with running_driver("reference", runtime_dir, state_dir, args=["--no-enforce-admission"]):
        yield runtime_dir


@pytest.mark.slow
@pytest.mark.parametrize("pause_s", [0.0, 0.01])
def test_the_adaptive_spin_is_tried_for_back_to_back_calls_only(
        reference: Path, pause_s: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """The adaptive burst (spin_us=None) tries the spin (its trial, after its blocked
    baseline) while the app calls back to back, and never while it pauses 10 ms between
    calls; a default burst never spins. Back to back is widened to 5 ms here: the app's
    own time between two calls stays inside it on a loaded machine."""
    monkeypatch.setattr(burst_spin, "BACK_TO_BACK_S", 0.005)
    n = KEPT + 3 * TOOK
    dev = nn.device("reference", reference)
    try:
        model = dev.prepare_model(add_model(4))
        with model.burst(spin_us=None) as b, model.burst() as never:
            for i in range(n):
                x = np.full((1, 4), i, np.float32)
                np.testing.assert_array_equal(b.execute({"x": x})["y"], x + 1)
                np.testing.assert_array_equal(never.execute({"x": x})["y"], x + 1)
                if pause_s:
                    time.sleep(pause_s)
            assert never.spin.spun == 0
            if pause_s:
                assert b.spin.spun == 0
            else:
                assert b.spin.spun >= TOOK, b.spin.spun
                assert len(b.spin.took[0]) == len(b.spin.took[1]) == TOOK
    finally:
        dev.close()
