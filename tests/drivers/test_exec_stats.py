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


def test_trace_replies_are_bounded_and_page_through_the_ring() -> None:
    """Every step since the cursor in one reply outgrew the 1 MiB frame once a busy device
    (or a recording that ended while the ring held its steps) had ~10,000 of them: `npu
    trace` got 'outgoing frame of 1326599 bytes exceeds 1048576' at each poll and no step.
    Each reply now holds at most MAX_REPLY_STEPS and says whether more follow."""
    import json

    from npumanager.drivers.exec_stats import MAX_REPLY_STEPS, ExecStats

    st = ExecStats()
    n = 3 * MAX_REPLY_STEPS + 5
    for i in range(n):
        # long floats, as monotonic times are: a step's JSON at its widest
        st.step(i % 4, 123456.0 + i * 1.2345678901e-4, 1.2345678901234567e-05,
                4_000_000_000, 2**31 - 1, 10**9 + i, i % 7)
    cursor, pages, seen = 0, 0, 0
    while True:
        got = st.steps_since(cursor, now=0.0)
        assert len(json.dumps(got)) < (1 << 20) * 3 // 4  # inside a frame (1 MiB)
        seen += len(got["steps"])
        cursor, pages = got["cursor"], pages + 1
        if not got["more"]:
            break
    assert (seen, pages, cursor) == (n, 4, n)
    assert st.steps_since(cursor, now=0.0) == {"cursor": n, "clock": "monotonic",
                                               "more": False, "steps": []}
