"""Pure status logic: ladder, hysteresis, dwell, headroom, trend."""

from __future__ import annotations

import itertools
import math

import pytest

from npumanager.constants import ThermalStatus as T
from npumanager.errors import InvalidArgument
from npumanager.thermal.status import (
    DwellFilter,
    HysteresisTracker,
    Trend,
    headroom,
    parse_thresholds,
    raw_status,
)

CFG = {
    "light": 60.0,
    "moderate": 70.0,
    "severe": 80.0,
    "critical": 90.0,
    "emergency": 95.0,
    "shutdown": 100.0,
}
LADDER = parse_thresholds(CFG)


@pytest.mark.parametrize(
    ("temp", "status"),
    [
        (20.0, T.NONE),
        (59.999, T.NONE),
        (60.0, T.LIGHT),
        (70.0, T.MODERATE),
        (79.9, T.MODERATE),
        (80.0, T.SEVERE),
        (90.0, T.CRITICAL),
        (95.0, T.EMERGENCY),
        (100.0, T.SHUTDOWN),
        (250.0, T.SHUTDOWN),
    ],
)
def test_threshold_maps_temperature_onto_ladder(temp: float, status: T) -> None:
    assert raw_status(temp, LADDER) == status


def test_thresholds_reject_missing_unknown_and_decreasing() -> None:
    with pytest.raises(InvalidArgument, match="missing shutdown"):
        parse_thresholds({k: v for k, v in CFG.items() if k != "shutdown"})
    with pytest.raises(InvalidArgument, match="unknown status 'warm'"):
        parse_thresholds({**CFG, "warm": 50.0})
    with pytest.raises(InvalidArgument, match=r"severe .* is below moderate"):
        parse_thresholds({**CFG, "severe": 65.0})
    with pytest.raises(InvalidArgument, match="must be a number"):
        parse_thresholds({**CFG, "light": "hot"})


def test_hysteresis_rises_immediately_and_falls_only_below_threshold_minus_margin() -> None:
    h = HysteresisTracker(LADDER, hysteresis_c=2.0)
    assert h.update(80.0) == T.SEVERE  # at the threshold: up at once
    assert h.update(79.0) == T.SEVERE  # 1 below: holds
    assert h.update(78.1) == T.SEVERE
    assert h.update(78.0) == T.MODERATE  # hysteresis_c below: falls
    assert h.update(79.9) == T.MODERATE  # and needs the threshold itself to come back
    assert h.update(80.0) == T.SEVERE


def test_hysteresis_falls_several_rungs_at_once_but_keeps_margin_on_each() -> None:
    h = HysteresisTracker(LADDER, hysteresis_c=2.0)
    h.update(96.0)
    assert h.status == T.EMERGENCY
    # 79 is below CRITICAL-2 and EMERGENCY-2 but within the margin of SEVERE.
    assert h.update(79.0) == T.SEVERE
    assert h.update(20.0) == T.NONE


def test_noisy_sensor_oscillating_around_threshold_does_not_flap() -> None:
    h = HysteresisTracker(LADDER, hysteresis_c=2.0)
    noise = [79.2, 80.3, 79.5, 80.1, 78.6, 80.8, 79.0, 80.0, 78.5, 81.0] * 5
    statuses = [h.update(t) for t in noise]
    changes = [b for a, b in itertools.pairwise(statuses) if a != b]
    assert statuses[0] == T.MODERATE
    assert changes == [T.SEVERE]  # one step up, never back down while the noise lasts
    # Without hysteresis the same noise flaps on nearly every sample.
    flappy = [raw_status(t, LADDER) for t in noise]
    assert sum(a != b for a, b in itertools.pairwise(flappy)) > 20


def test_dwell_delays_falling_never_rising() -> None:
    d = DwellFilter(min_dwell_s=10.0)
    assert d.update(T.NONE, 0.0) == T.NONE
    assert d.update(T.SEVERE, 1.0) == T.SEVERE  # rising: immediate
    assert d.update(T.NONE, 5.0) == T.SEVERE  # 4 s into SEVERE: held
    assert d.update(T.NONE, 10.9) == T.SEVERE
    assert d.update(T.CRITICAL, 10.95) == T.CRITICAL  # still rises at once
    assert d.update(T.LIGHT, 20.0) == T.CRITICAL
    assert d.update(T.LIGHT, 20.95) == T.LIGHT  # 10 s after CRITICAL began


def test_headroom_is_one_at_severe_and_zero_span_below() -> None:
    assert headroom(80.0, 80.0) == pytest.approx(1.0)
    assert headroom(50.0, 80.0) == 0.0
    assert headroom(20.0, 80.0) == 0.0  # never negative
    assert headroom(65.0, 80.0) == pytest.approx(0.5)
    assert headroom(86.0, 80.0) == pytest.approx(1.2)  # above SEVERE: > 1
    assert headroom(70.0, 80.0, span_c=10.0) == pytest.approx(0.0)
    assert math.isnan(headroom(math.nan, 80.0))


def test_trend_forecasts_a_rising_line_and_needs_three_samples() -> None:
    tr = Trend(window_s=30.0)
    tr.add(0.0, 50.0)
    tr.add(1.0, 51.0)
    assert tr.forecast(10.0) == 51.0  # too few samples: the latest reading
    tr.add(2.0, 52.0)
    assert tr.slope() == pytest.approx(1.0)
    assert tr.forecast(10.0) == pytest.approx(62.0)
    assert tr.forecast(0.0) == 52.0


def test_trend_window_forgets_old_samples() -> None:
    tr = Trend(window_s=5.0)
    for t in range(10):  # hot and falling, then flat
        tr.add(float(t), 90.0 - t if t < 5 else 60.0)
    tr.add(10.0, 60.0)
    tr.add(11.0, 60.0)
    assert tr.slope() == pytest.approx(0.0)
    assert tr.forecast(30.0) == pytest.approx(60.0)
