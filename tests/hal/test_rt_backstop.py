"""An app's own bound on its real-time threads (hal/rt_backstop.py), in forked children (a
signal handler and a lowered RLIMIT_RTTIME are for life): the limits it sets, the handler
it installs and what it does with a SIGXCPU that is not RLIMIT_RTTIME's (the app's own
disposition, kept), and, as root, a thread at FIFO that spins lowered at the soft limit
without the app's own handler being called, or killed at the hard one."""

from __future__ import annotations

import os
import resource
import signal
import threading
import time
from types import FrameType
from typing import Any

import pytest

from npumanager.errors import RealtimeUnavailable
from npumanager.hal import rt_backstop as bs
from npumanager.hal import rt_sched as rt
from npumanager.testing import procs
from tests.hal.test_rt_sched import needs_fifo

#: FIFO spinners here: one such test at a time (tests/conftest.py).
pytestmark = pytest.mark.fifo


def fresh() -> None:
    """In a child: the backstop as in a process that never used it (the parent, a pytest
    worker, may have: a test's in-process ask), but for the hard limit, which stays."""
    signal.signal(signal.SIGXCPU, signal.SIG_DFL)
    bs._installed, bs._previous = False, None
    bs.counts.update(signals=0, lowered=0, passed_on=0, lowered_gone=0)
    _soft, hard = resource.getrlimit(resource.RLIMIT_RTTIME)
    resource.setrlimit(resource.RLIMIT_RTTIME, (hard, hard))


def limits_after_prepare(app_soft: int | None) -> dict[str, Any]:
    fresh()
    if app_soft is not None:
        hard = resource.getrlimit(resource.RLIMIT_RTTIME)[1]
        resource.setrlimit(resource.RLIMIT_RTTIME, (app_soft, hard))
    bs.prepare(threading.get_native_id())
    return {"limits": resource.getrlimit(resource.RLIMIT_RTTIME),
            "handler": signal.getsignal(signal.SIGXCPU) is bs._on_sigxcpu}


def test_prepare_bounds_the_process_and_installs_the_handler() -> None:
    got = procs.spawn_as(None, None, limits_after_prepare, None).wait(30)
    assert got == {"limits": (bs.RTTIME_SOFT_US, rt.RTTIME_HARD_US), "handler": True}
    # An app's own lower soft limit is kept (it wants SIGXCPU sooner), never raised.
    got = procs.spawn_as(None, None, limits_after_prepare, 20_000).wait(30)
    assert got == {"limits": (20_000, rt.RTTIME_HARD_US), "handler": True}


def off_the_main_thread() -> dict[str, Any]:
    fresh()
    out: dict[str, Any] = {}

    def ask() -> None:
        bs.prepare(threading.get_native_id())
        out["limits"] = resource.getrlimit(resource.RLIMIT_RTTIME)
        out["handler"] = signal.getsignal(signal.SIGXCPU) == signal.SIG_DFL

    t = threading.Thread(target=ask)
    t.start()
    t.join(10)
    return out


def test_off_the_main_thread_the_hard_limit_is_the_bound() -> None:
    """Python installs no handler there: no soft limit below the hard one (SIGXCPU's
    default would end the process at 50 ms), the hard limit set all the same."""
    got = procs.spawn_as(None, None, off_the_main_thread).wait(30)
    assert got == {"limits": (rt.RTTIME_HARD_US, rt.RTTIME_HARD_US), "handler": True}


def sigxcpu_not_rttimes(previous: str) -> list[Any]:
    """The app's SIGXCPU disposition, then the backstop, then a SIGXCPU that is not
    RLIMIT_RTTIME's (sent, as RLIMIT_CPU's is)."""
    fresh()
    seen: list[Any] = []

    def mine(signum: int, frame: FrameType | None) -> None:
        seen.append(("mine", signum))

    signal.signal(signal.SIGXCPU, {"handler": mine, "ignore": signal.SIG_IGN,
                                   "default": signal.SIG_DFL}[previous])
    bs.prepare(threading.get_native_id())
    os.kill(os.getpid(), signal.SIGXCPU)
    time.sleep(0.05)  # (the handler runs between bytecodes)
    seen.append(dict(bs.counts))
    return seen


@pytest.mark.parametrize("previous", ["handler", "ignore"])
def test_a_sigxcpu_that_is_not_rttimes_goes_to_what_the_app_had(previous: str) -> None:
    got = procs.spawn_as(None, None, sigxcpu_not_rttimes, previous).wait(30)
    mine = [("mine", int(signal.SIGXCPU))] if previous == "handler" else []
    assert got == [*mine, {"signals": 0, "lowered": 0, "passed_on": 1, "lowered_gone": 0}]


def test_sigxcpus_default_still_ends_the_process() -> None:
    """SIG_DFL before: RLIMIT_CPU's SIGXCPU still ends the process (its default action
    restored and the signal sent again)."""
    child = procs.spawn_as(None, None, sigxcpu_not_rttimes, "default")
    with pytest.raises(procs.ChildFailed):
        child.wait(30)
    assert child.exit_status is not None and os.WIFSIGNALED(child.exit_status)
    assert os.WTERMSIG(child.exit_status) == signal.SIGXCPU


def foreign_handler() -> str:
    # (a handler installed outside Python reads as None; faked here, as installing one
    # needs C code)
    fresh()
    signal.getsignal = lambda signum: None  # type: ignore[assignment]
    try:
        bs.prepare(threading.get_native_id())
    except RealtimeUnavailable as exc:
        return str(exc)
    return "installed"


def test_a_handler_installed_outside_python_is_refused_not_replaced() -> None:
    got = procs.spawn_as(None, None, foreign_handler).wait(30)
    assert "outside Python" in got and "cannot chain" in got, got


def spin_at_fifo(ignore: bool) -> dict[str, Any]:
    """As root: the app's own SIGXCPU handler, the backstop, then the main thread at FIFO
    (set here: root may) spinning until it is lowered (2 s of CPU at most). ``ignore``:
    the app then sets SIGXCPU to SIG_IGN itself, over the backstop's handler."""
    fresh()
    seen: list[int] = []
    signal.signal(signal.SIGXCPU, lambda s, f: seen.append(s))
    tid = threading.get_native_id()
    bs.prepare(tid)
    if ignore:
        signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    assert rt.set_fifo(tid, 1).ok
    t0 = rt.cpu_ns(0) or 0
    while (s := rt.sched_of(0)) is not None and s.fifo:
        if (rt.cpu_ns(0) or 0) - t0 > 2_000_000_000:
            break
    return {"fifo_cpu_ms": ((rt.cpu_ns(0) or 0) - t0) / 1e6, "after": rt.sched_of(0),
            "app_handler": seen, "counts": dict(bs.counts),
            "limits": resource.getrlimit(resource.RLIMIT_RTTIME)}


@needs_fifo
def test_a_spinning_fifo_thread_is_lowered_at_the_soft_limit() -> None:
    got = procs.spawn_as(None, None, spin_at_fifo, False).wait(30)
    print("CPU at FIFO before SIGXCPU lowered it:", got["fifo_cpu_ms"], "ms")
    assert got["after"] == rt.ThreadSched(os.SCHED_OTHER, 0, True), got
    assert got["counts"] == {"signals": 1, "lowered": 1, "passed_on": 0,
                             "lowered_gone": 0}, got
    assert got["app_handler"] == [], got  # RLIMIT_RTTIME's signal: not passed on
    assert got["limits"] == (bs.RTTIME_SOFT_US, rt.RTTIME_HARD_US)  # (set again)
    # After the soft limit's CPU at FIFO, before the hard limit that kills.
    assert bs.RTTIME_SOFT_US / 1000 * 0.9 <= got["fifo_cpu_ms"] < rt.RTTIME_HARD_US / 1000


@needs_fifo
def test_a_spinner_whose_process_ignores_sigxcpu_is_killed_at_the_hard_limit() -> None:
    """The app set SIGXCPU to SIG_IGN after its grant: nothing lowers the thread, and
    the kernel ends the process (SIGKILL) after 500 ms of CPU at FIFO (also the bound
    where the handler cannot run in time: a main thread blocked in a C call)."""
    # (t0 before the fork: on a loaded machine the parent may run again only after the
    # child has spun for a while, which once read as a kill before the hard limit)
    t0 = time.monotonic()
    child = procs.spawn_as(None, None, spin_at_fifo, True)
    with pytest.raises(procs.ChildFailed):
        child.wait(30)
    took = time.monotonic() - t0
    print("the process killed after", round(took * 1000), "ms")
    assert child.exit_status is not None and os.WIFSIGNALED(child.exit_status)
    assert os.WTERMSIG(child.exit_status) == signal.SIGKILL
    assert took >= rt.RTTIME_HARD_US / 1e6 * 0.9


def worker_spins(wait: str) -> dict[str, Any]:
    """As root: the backstop installed on the main thread; a worker asks for itself
    (blocking SIGXCPU there), is put at FIFO and spins, while the main thread waits in
    ``join()`` or an asyncio loop (off the GIL: the worker never waits for it).

    Each thread on a CPU of its own. The kernel may wake the main thread on the spinning
    worker's CPU, where it waits behind a FIFO thread until the load balancer moves it; in
    a CI run beside a busy suite that took past the hard limit, and the kernel killed the
    process. Where the kernel wakes a thread is not what this test checks, and the hard
    limit is that case's bound (test_a_spinner_whose_process_ignores_sigxcpu_is_killed_at_
    the_hard_limit)."""
    import asyncio

    fresh()
    bs.install()
    out: dict[str, Any] = {}
    main_cpu, worker_cpu = sorted(os.sched_getaffinity(0))[:2]
    os.sched_setaffinity(0, {main_cpu})  # (Linux: pid 0 is the calling thread)

    def spin() -> None:
        os.sched_setaffinity(0, {worker_cpu})
        tid = threading.get_native_id()
        bs.prepare(tid)
        out["blocked"] = signal.SIGXCPU in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        assert rt.set_fifo(tid, 1).ok
        t0 = rt.cpu_ns(0) or 0
        while (s := rt.sched_of(0)) is not None and s.fifo:
            if (rt.cpu_ns(0) or 0) - t0 > 2_000_000_000:
                break
        out["fifo_cpu_ms"] = ((rt.cpu_ns(0) or 0) - t0) / 1e6
        out["after"] = rt.sched_of(0)

    t = threading.Thread(target=spin)
    t.start()
    if wait == "join":
        t.join()
    else:
        async def main() -> None:
            while t.is_alive():
                await asyncio.sleep(0.5)

        asyncio.run(main())
    out["counts"] = dict(bs.counts)
    return out


@needs_fifo
@pytest.mark.parametrize("wait", ["join", "asyncio"])
def test_a_spinning_worker_is_lowered_by_the_main_threads_handler(wait: str) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: a FIFO worker spinning there leaves the main thread none "
                    "before the hard limit")
    got = procs.spawn_as(None, None, worker_spins, wait).wait(30)
    print(f"a worker at FIFO, main in {wait}: lowered after", got["fifo_cpu_ms"], "ms")
    assert got["blocked"] and got["counts"]["signals"] == 1, got
    assert got["after"] == rt.ThreadSched(os.SCHED_OTHER, 0, True), got
    assert bs.RTTIME_SOFT_US / 1000 * 0.9 <= got["fifo_cpu_ms"] < rt.RTTIME_HARD_US / 1000
