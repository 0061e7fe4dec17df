"""Whose CPU a contention phase saw (npumanager/demo/contention_cpu.py): a child that
spins counts as the run's, a process the run did not start as foreign."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from npumanager.demo.contention_cpu import CpuMark, between, mark

SPIN = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\n"


def test_between_splits_busy_time_into_ours_and_foreign() -> None:
    a = CpuMark(busy=1000, steal=5, ours={1: 100, 2: 50}, tick=0.01)
    b = CpuMark(busy=1300, steal=25, ours={1: 180, 2: 70, 3: 10}, tick=0.01)
    use = between(a, b, seconds=2.0)
    # ours: 80 + 20 + 10 jiffies; foreign: 300 - 110; per second of the phase, in cores.
    assert (use.ours, use.foreign, use.steal) == pytest.approx((0.55, 0.95, 0.1))
    assert use.cell() == "0.55 / 0.95 / 0.10"


def test_a_spinning_child_is_ours() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)\n" + SPIN])
    try:
        time.sleep(0.1)
        a = mark([child.pid])
        t0 = time.monotonic()
        child.wait(30)
        use = between(a, mark([]), time.monotonic() - t0)  # reaped: in our cutime
    finally:
        child.kill()
        child.wait()
    assert use.ours * (time.monotonic() - t0) >= 0.4


def test_a_stranger_spinning_is_foreign() -> None:
    # Started outside the marks' process lists (as another user's compiler would be).
    stranger = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        time.sleep(0.05)
        a = mark([])
        t0 = time.monotonic()
        time.sleep(0.4)
        use = between(a, mark([]), time.monotonic() - t0)
    finally:
        stranger.kill()
        stranger.wait()
    assert use.foreign >= 0.3
    assert os.getpid() in a.ours
