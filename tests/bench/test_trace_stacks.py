"""bench/trace_stacks.py: sleeps classified by their kernel stacks (a made-up ``perf
script`` text in the format perf 6.1 prints), the GIL told from other futexes by address,
wakers by theirs, and a frame's critical path cut into states."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from trace_stacks import excess_table, parse_script, states

GIL = (0xA5B740, 0xA5B740 + 0x28B20)
BURST, LOOP, WORKER = 11, 10, 12


def sw(t: float, prev: int, state: str, nxt: int, *frames: str) -> str:
    head = (f" {prev} [000] {t:.6f}: sched:sched_switch: prev_comm=python prev_pid={prev} "
            f"prev_prio=120 prev_state={state} ==> next_comm=x next_pid={nxt} next_prio=120")
    return "\n".join([head, *(f"\tffffffff8100{i:04x} {f}" for i, f in enumerate(frames)), ""])


def wake(t: float, waker: int, woken: int, *frames: str) -> str:
    head = (f" {waker} [001] {t:.6f}: sched:sched_waking: comm=python pid={woken} prio=120 "
            "target_cpu=000")
    return "\n".join([head, *(f"\tffffffff8100{i:04x} {f}" for i, f in enumerate(frames)), ""])


def futex(t: float, tid: int, addr: int) -> str:
    return (f" {tid} [000] {t:.6f}: syscalls:sys_enter_futex: uaddr: 0x{addr:08x}, "
            "op: 0x00000089, val: 0x00000000, utime: 0x7f0000000000, uaddr2: 0x00000000, "
            "val3: 0xffffffff\n")


SCRIPT = "".join([
    futex(1.0000, BURST, 0xA5B8F0),  # the GIL's condition
    sw(1.0001, BURST, "S", 0, "__schedule", "schedule", "futex_do_wait", "__futex_wait",
       "futex_wait", "do_futex", "__x64_sys_futex", "do_syscall_64"),
    wake(1.0021, LOOP, BURST, "try_to_wake_up", "wake_up_q", "futex_wake", "do_futex"),
    sw(1.0025, 0, "R", BURST, "__schedule"),
    futex(1.0030, BURST, 0x5555AA00),  # a threading lock on the heap
    sw(1.0031, BURST, "S", 0, "__schedule", "schedule", "futex_wait", "__x64_sys_futex"),
    wake(1.0041, WORKER, BURST, "try_to_wake_up", "futex_wake"),
    sw(1.0041, 0, "R", BURST, "__schedule"),
    sw(1.0050, BURST, "S", 0, "__schedule", "schedule", "rwsem_down_read_slowpath",
       "lock_mm_and_find_vma", "do_user_addr_fault", "exc_page_fault"),
    wake(1.0060, WORKER, BURST, "try_to_wake_up", "rwsem_wake", "up_write",
         "__vm_munmap", "__x64_sys_munmap"),
    sw(1.0062, 0, "R", BURST, "__schedule"),
    sw(1.0070, BURST, "S", 0, "__schedule", "schedule", "do_nanosleep", "hrtimer_nanosleep"),
    # (a timer's wake-up fires in whatever thread the interrupt found running)
    wake(1.0080, LOOP, BURST, "try_to_wake_up", "hrtimer_wakeup", "__hrtimer_run_queues"),
    sw(1.0080, 0, "R", BURST, "__schedule"),
    sw(1.0090, BURST, "R", 0, "__schedule", "schedule", "irqentry_exit_to_user_mode"),
    sw(1.0095, 0, "R", BURST, "__schedule"),
])


def test_sleeps_are_classified_by_stack_futex_address_and_waker_stack() -> None:
    offs = parse_script(SCRIPT, GIL)[BURST]
    assert [o.sleep for o in offs] == ["futex GIL", "futex lock@5555aa00",
                                       "rwsem-read in page fault", "nanosleep", "preempted"]
    assert [o.wake for o in offs[:4]] == ["futex wake", "futex wake",
                                          "rwsem release in munmap", "timer"]
    assert [o.waker for o in offs[:3]] == [LOOP, WORKER, WORKER]
    assert abs(offs[0].woke - 1.0021) < 1e-9 and abs(offs[0].back - 1.0025) < 1e-9
    assert abs(offs[4].back - 1.0095) < 1e-9


def test_states_cut_a_span_into_running_runnable_and_sleeps() -> None:
    offs = parse_script(SCRIPT, GIL)[BURST]
    names = {LOOP: "host:event-loop", WORKER: "host:npu-bg_0"}
    got = states(offs, 1.0000, 1.0100, names.get)
    ms = {k: round(v * 1e3, 3) for k, v in got.items()}
    assert ms["futex GIL / futex wake by host:event-loop"] == 2.0
    assert ms["futex lock@5555aa00 / futex wake by host:npu-bg_0"] == 1.0
    assert ms["rwsem-read in page fault / rwsem release in munmap by host:npu-bg_0"] == 1.0
    assert ms["nanosleep / timer"] == 1.0
    # woken until back on a CPU (0.4 + 0 + 0.2 + 0), and the preemption (0.5)
    assert ms["runnable (woken)"] == 0.6 and ms["runnable (preempted)"] == 0.5
    assert abs(sum(got.values()) - 0.0100) < 1e-9  # the span, whole
    # with a holder split, runnable time is the split's, not the trace's own
    split = states(offs, 1.0000, 1.0100, names.get, lambda a, b: {"app-loader": 0.0007})
    assert round(split["runnable, CPU had by app-loader"] * 1e3, 3) == 0.7
    assert "runnable (woken)" not in split and "runnable (preempted)" not in split


def test_excess_is_over_the_typical_mean_and_counts_frames_with_more() -> None:
    slow = [{"a": 0.003, "b": 0.001}, {"a": 0.001, "b": 0.001}]
    typical = [{"a": 0.001, "b": 0.001}, {"a": 0.001}]
    rows = {k: (round(ms, 3), n) for k, ms, n in excess_table(slow, typical)}
    assert rows["a"] == (2.0, 1)
    assert rows["b"] == (1.0, 2)  # 0.5 ms over the typical mean (0.5 ms) in each


def test_the_loops_gil_samples_by_frame(tmp_path: Path, capsys: Any) -> None:
    from trace_loop import print_loop

    (tmp_path / "loading.pyspy.txt").write_text(
        "thread (10): MainThread;run (asyncio/base_events.py:1);"
        "_serve (npumanager/drivers/host.py:5);decode (google/protobuf/x.py:3) 7\n"
        "thread (10): MainThread;run (asyncio/base_events.py:1);select (selectors.py:2) 2\n"
        "thread (12): npu-bg_0;run (npumanager/drivers/steps.py:9) 5\n")
    print_loop(str(tmp_path), "loading", 10, lambda t: {10: "host:event-loop"}.get(t, "w"))
    out = capsys.readouterr().out
    assert "samples holding the GIL: 14 in all, the event loop 9" in out
    assert "host:event-loop 9, w 5" in out
    assert "      7 _serve (npumanager/drivers/host.py:5)" in out
    assert "      7 decode (google/protobuf/x.py:3)" in out
