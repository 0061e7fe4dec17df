"""The starvation bound of a compile that runs in the host itself (drivers/compile_watch.py):
a lowered compiling thread and the processes it forks (torch's g++), watched from a
normal-priority thread, raised for one bound when they starved one.

The real-process case is made deterministic by pinning: the compiling thread (its child
inherits it) and two normal-priority busy loops share one CPU, so the compile gets that
CPU only when raised (at SCHED_IDLE, EEVDF gives it a weight of 3 against the loops'
2 x 1024: ~0.15 %, so its 0.3 s of CPU would take minutes). The raise goes through npud's
code (service/host_raise.py) with the host's own raising off, as where RLIMIT_NICE
forbids it; the loops run only inside the test and are killed in it."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from npumanager.clock import MonotonicClock
from npumanager.drivers.compile_starve import CompileRaiser
from npumanager.drivers.compile_watch import CompileWatch, TreeProgress
from npumanager.errors import NpuError
from npumanager.service.host_raise import HostRaises
from npumanager.testing.spinners import spin_every_cpu
from npumanager.testing.spinners import stop as stop_spinning

IDLE = os.SCHED_IDLE
#: About 0.3 s of CPU in a fresh interpreter (the stand-in for g++).
_WORK = "x = 0\nfor i in range(6_000_000): x += i\nprint(x)"


def _via_npud(raises: HostRaises, bound_s: float) -> CompileRaiser:
    """A host raiser that may not raise itself and asks npud's code (here, in-process)."""
    raiser = CompileRaiser("watch-test", local=False)

    def ask(pid: int, tid: int) -> bool:
        try:
            raises.raise_tree(os.getpid(), pid, tid, bound_s)
            raiser.applied(pid, tid, True, "")
        except NpuError as e:
            raiser.applied(pid, tid, False, f"{type(e).__name__}: {e}")
        return True

    raiser.ask = ask
    return raiser


def _state(pid: int) -> bytes:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0]


def test_a_blocked_tree_makes_progress_a_runnable_one_only_by_its_cpu() -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        # (just forked, it is runnable while it execs and loads: sample once it sleeps,
        # or a loaded machine shows it runnable with no CPU moved, i.e. starved)
        deadline = time.monotonic() + 10
        while _state(sleeper.pid) != b"S" and time.monotonic() < deadline:
            time.sleep(0.01)
        tree = TreeProgress(sleeper.pid, 0)
        assert tree.sample(10.0) == 0.0
        assert tree.sample(10.5) == 0.5  # asleep: not starved, the whole interval counts
    finally:
        sleeper.kill()
        sleeper.wait()
    assert tree.sample(11.0) is None  # gone


def test_a_compile_that_blocks_is_not_raised() -> None:
    raiser = CompileRaiser("watch-test", local=False)
    asked: list[tuple[int, int]] = []
    raiser.ask = lambda pid, tid: asked.append((pid, tid)) is None
    watch = CompileWatch("watch-test", 20, raiser)
    try:
        assert watch.run(lambda: (time.sleep(0.3), 7)[1]) == 7
        assert watch.compiles == 1 and watch.raises == 0 and asked == []
    finally:
        watch.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="npud's raise needs CAP_SYS_NICE")
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 1, reason="no CPU")
@pytest.mark.timeout(120)
def test_a_compile_thread_kept_from_its_cpu_is_raised_through_npud_and_completes() -> None:
    cpu = max(os.sched_getaffinity(0))
    bound_s = 0.1
    raises = HostRaises(MonotonicClock())
    raiser = _via_npud(raises, bound_s)
    watch = CompileWatch("watch-test", int(bound_s * 1e3), raiser)
    loops: list[subprocess.Popen[bytes]] = []

    def spin_on_cpu() -> None:  # (affinity is per thread: the loops inherit this one's)
        os.sched_setaffinity(0, {cpu})
        loops.extend(spin_every_cpu(2))

    def compile_stand_in() -> str:
        os.sched_setaffinity(0, {cpu})
        os.sched_setscheduler(0, IDLE, os.sched_param(0))  # a lowered compile thread
        return subprocess.run([sys.executable, "-c", _WORK], capture_output=True,
                              check=True, timeout=100).stdout.decode()

    got: dict[str, object] = {}
    try:
        s = threading.Thread(target=spin_on_cpu)
        s.start()
        s.join(60)
        assert len(loops) == 2
        t0 = time.monotonic()
        t = threading.Thread(target=lambda: got.update(out=watch.run(compile_stand_in)))
        t.start()
        t.join(100)
        got["s"] = time.monotonic() - t0
    finally:
        stop_spinning(loops)
        watch.close()
    assert got.get("out") == f"{sum(range(6_000_000))}\n", got
    assert watch.raises >= 1 and raises.raised >= 1, (watch.counts(), got)
    counts = raiser.counts()
    assert raiser.via == "npud" and counts["raised_npud"] == raises.raised, counts
