"""The camera's frames split by the driver's records (demo/contention_split.py): pure
pairing on made-up times, and one real managed run that pairs its frames."""

from __future__ import annotations

import math

import pytest

from npumanager.demo.contention import Timing, build_models, driver_config
from npumanager.demo.contention_split import (
    SplitRun,
    camera_records,
    in_window,
    split,
    summarize,
)
from npumanager.drivers.burst_counters import STAGES
from tests.demo.conftest import LeftBehind


def record(called: float, rung: float, seen: float, answered: float,
           stages: list[float] | None = None) -> list[float | None]:
    """A burst record as drivers/burst_counters.py keeps it (times s, stages µs)."""
    head: list[float | None] = [seen, 0.0, None, None, None, None, None, answered, 300.0,
                                None, 1.0]
    return [*head, *(stages if stages is not None else [None] * len(STAGES)), None, None,
            called, rung]


def test_a_frame_is_split_into_its_parts() -> None:
    # A 2 ms frame: rung 0.1 ms after the call, seen 0.3 ms later, served in 1 ms, and
    # 0.6 ms until the call returned; the app reported it 0.05 ms after the return.
    called = 100.0
    rec = record(called, called + 0.0001, called + 0.0004, called + 0.0014,
                 [10.0, 20.0, 30.0, 5.0, 800.0, 0.0, 20.0, 40.0, 100.0, 50.0])
    [row] = split([(called + 0.00205, 2.0)], [rec])
    assert row["call>rung"] == pytest.approx(0.1)
    assert row["rung>seen"] == pytest.approx(0.3)
    assert row["served"] == pytest.approx(1.0)
    assert row["back"] == pytest.approx(0.6)
    assert row["run"] == pytest.approx(0.8)


def test_frames_pair_with_their_own_requests_only() -> None:
    recs = [record(10.0 + i / 30, 10.0 + i / 30, 10.0 + i / 30 + 1e-4, 10.0 + i / 30 + 6e-4)
            for i in range(5)]
    # Frame 2's record is missing; a frame far from any request pairs with nothing.
    del recs[2]
    frames = [(10.0 + i / 30 + 0.0007, 0.7) for i in range(5)] + [(50.0, 1.0)]
    rows = split(frames, recs)
    assert len(rows) == 4
    assert all(r["served"] == pytest.approx(0.5) for r in rows)
    assert all(math.isnan(r["run"]) for r in rows)  # (no stages recorded)


def test_the_window_ends_at_the_last_recorded_call() -> None:
    # Five frames in the window; the host had kept the records of the first four when they
    # were fetched (the fifth answered, not yet recorded): the fifth is not counted as one
    # the split failed to pair, and no other frame is left out.
    recs = [record(10.0 + i / 30, 10.0 + i / 30, 10.0 + i / 30 + 1e-4, 10.0 + i / 30 + 6e-4)
            for i in range(4)]
    frames = [(10.0 + i / 30 + 0.0007, 0.7) for i in range(5)] + [(9.0, 0.7), (20.0, 0.7)]
    assert in_window(frames, 10.0, 11.0, recs) == frames[:4]
    assert len(split(in_window(frames, 10.0, 11.0, recs), recs)) == 4
    # No records fetched: every frame of the window is the split's (and none pairs).
    assert in_window(frames, 10.0, 11.0, []) == frames[:5]


def test_summary_keeps_the_slow_frames_apart() -> None:
    rows = [{"ms": float(i), "call>rung": 0.0, "rung>seen": 0.0, "served": float(i),
             "back": 0.0, **{s: 0.0 for s in STAGES}} for i in range(1, 101)]
    s = summarize(rows, q=0.95, worst=2)
    assert s["n"] == 100 and s["n_slow"] == 5
    assert s["slow"]["served"] == 98.0  # (the median of 96..100)
    assert [w["ms"] for w in s["worst"]] == [100.0, 99.0]
    assert summarize([]) == {}


def test_the_camera_is_picked_by_uid_or_as_the_foreground() -> None:
    stats = {"bursts": [{"uid": 1, "foreground": True, "recent": [[1.0]]},
                        {"uid": 2, "foreground": False, "recent": [[2.0]]}]}
    assert camera_records(stats, 2) == [[2.0]]
    assert camera_records(stats, None) == [[1.0]]


@pytest.mark.slow
def test_a_managed_run_pairs_its_frames(left_behind: LeftBehind) -> None:
    timing = Timing(alone_s=0.6, contended_s=0.6, loading_s=0.6, settle_s=0.1)
    run = SplitRun("split", True, timing, build_models(), driver_config(),  # type: ignore[arg-type]
                   phases=("alone", "contended"))
    r = run.run()
    assert r.errors == []
    alone = run.frame_split["alone"]
    # Every frame the camera reported in the window, up to when the driver's records
    # were fetched and called up to the last request they hold, was paired with its
    # request (in_window: a frame answered but not yet recorded is not the split's).
    assert alone["n"] == run.split_frames["alone"] > 0
    assert run.split_frames["alone"] >= len(r.camera["alone"].ms) // 2  # (not fetched early)
    assert alone["all"]["served"] > 0 and alone["all"]["run"] > 0
    assert left_behind() == []


class EmbedderSplit(SplitRun):
    split_app = "embedder"
    split_event = "batch"
    split_q = 0.9


@pytest.mark.slow
def test_an_app_on_a_second_host_pairs_with_that_hosts_records(
        left_behind: LeftBehind) -> None:
    """The embedder served by a second [[driver]] (bench rows *-own-host): its batches pair
    with the records of the host that serves it, fetched as the phase ends (the first
    host has no burst of its)."""
    cfg = driver_config()
    cfg["driver"].append({**cfg["driver"][0], "name": "reference-bg"})
    timing = Timing(alone_s=0.6, contended_s=1.0, loading_s=0.6, settle_s=0.1)
    run = EmbedderSplit("split-bg", True, timing, build_models(), cfg,  # type: ignore[arg-type]
                        phases=("alone", "contended"),
                        devices={"embedder": "reference-bg", "llm": "reference-bg"})
    r = run.run()
    assert r.errors == []
    contended = run.frame_split["contended"]
    assert contended and contended["n"] > 0 and contended["all"]["run"] > 0
    assert left_behind() == []
