"""drivers/exec_stats.py: the snapshot device.stats takes while burst threads record.

A busy background burst (the contention bench's embedder on a host of its own: ~1500
batches a second, each recorded by the burst's thread) appended to a uid's deque while
the snapshot iterated it in Python, and ``device.stats`` failed with "deque mutated
during iteration" (3 of 6 phases' fetches in two quick runs of
bench/contention_embed_split.py)."""

from __future__ import annotations

import sys
import threading

from npumanager.drivers.exec_stats import ExecStats


def test_a_snapshot_while_another_thread_records_does_not_fail() -> None:
    stats = ExecStats(window_s=1e9)  # (nothing ages out: every sample is iterated)
    for i in range(2000):
        stats.record(7, 0.0005, now=float(i))
    stop = threading.Event()

    def recorder() -> None:
        t = 2000.0
        while not stop.is_set():
            t += 1
            stats.record(7, 0.0005, now=t)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # (hand the GIL over as often as the interpreter can)
    th = threading.Thread(target=recorder, daemon=True)
    th.start()
    try:
        for _ in range(200):
            snap = stats.snapshot(now=0.0)
            assert snap["uids"]["7"]["executions"] >= 2000
    finally:
        stop.set()
        th.join()
        sys.setswitchinterval(old)
