"""bench/trace_sleeps.py: the burst thread's sleeps inside slow frames, by waker (pure, on a
made-up trace: switches (t, cpu, prev, next, prev state) and wake-ups (t, woken, waker))."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from trace_sleeps import sleeps_by_waker

BURST, WORKER, MAIN, CAMERA = 11, 12, 10, 20
THREADS = {BURST: (10, "host", "normal", 0, "python"),
           WORKER: (10, "host", "idle", 0, "npu-bg_0"),
           MAIN: (10, "host", "normal", 0, "python"),
           CAMERA: (20, "camera", "normal", 0, "python")}


def test_sleeps_are_put_down_to_their_waker_within_the_frames_only() -> None:
    switches = [
        (0.0095, 0, BURST, 0, "S"),   # asleep before the frame, woken inside it by the worker
        (0.0110, 0, BURST, 0, "S"),   # inside: woken by the event loop
        (0.0120, 1, BURST, 0, "R"),   # preempted: runnable, not a sleep
        (0.0130, 0, BURST, 0, "S"),   # too short to count
        (0.0300, 0, BURST, 0, "S"),   # after the frame's span
    ]
    wakes = [(0.0105, BURST, WORKER), (0.0115, BURST, MAIN), (0.01305, BURST, CAMERA),
             (0.0310, BURST, CAMERA)]
    got = sleeps_by_waker(switches, wakes, BURST, [(0.0100, 0.0140)], THREADS)
    assert set(got) == {"host:npu-bg_0", "host:main"}
    assert got["host:npu-bg_0"][0] == 1 and abs(got["host:npu-bg_0"][1] - 0.0005) < 1e-9
    assert got["host:main"][0] == 1 and abs(got["host:main"][1] - 0.0005) < 1e-9


def test_no_slow_frames_no_sleeps() -> None:
    assert sleeps_by_waker([(0.01, 0, BURST, 0, "S")], [(0.02, BURST, MAIN)], BURST, [],
                           THREADS) == {}
