"""npud's shell around the real-time grants (service/rt_apps.py), in-process, asked by a
forked app of this uid: the watchdog samples on npud's (virtual) clock. As root the kernel
takes SCHED_FIFO and the demotions are checked; as any other uid the kernel refuses and
the caller gets RealtimeUnavailable naming CAP_SYS_NICE (both paths are real syscalls).
Attacks under other uids: tests/security/test_app_realtime.py."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from npumanager import Importance, NpuManager
from npumanager.client import AsyncNpuManager, calls
from npumanager.errors import NpuError, PermissionDenied
from npumanager.hal import rt_sched
from npumanager.service.daemon import Daemon
from npumanager.testing import VirtualClock, procs
from tests.service.test_daemon import run_scenario, settle

#: FIFO spinners here: one such test at a time (tests/conftest.py).
pytestmark = pytest.mark.fifo

RT = {"app_rt_priority": 1, "app_rt_sample_s": 0.15}
#: The app's uid when run as root (root's own importance is always FOREGROUND).
APP = 50001


def _fifo(tid: int = 0) -> bool:
    s = rt_sched.sched_of(tid)
    return s is not None and s.fifo


def _until(pred: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end and not pred():
        time.sleep(0.005)
    return bool(pred())


def app(rt: str) -> str:
    """Another process (npud refuses its own threads): its main thread asked for, then
    held until told; what it sees of its own policy announced."""
    with NpuManager(rt) as mgr:
        try:
            mgr.set_thread_realtime()
        except NpuError as exc:
            return f"{type(exc).__name__}: {exc}"
        procs.announce(("fifo", _fifo()))
        procs.receive(timeout=30)  # the test changed something
        procs.announce(("fifo", _fifo() if _until(lambda: not _fifo(), 0.3) else True))
        procs.receive(timeout=30)
    procs.announce(("closed-fifo", not _until(lambda: not _fifo(), 5.0)))
    return "done"


@pytest.mark.skipif(os.getuid() == 0, reason="root has CAP_SYS_NICE: the kernel takes it")
def test_rt_a_kernel_that_refuses_is_realtime_unavailable(runtime_dir: Path) -> None:
    async def scenario(d: Daemon, mgr: AsyncNpuManager, log: Any, clock: VirtualClock) -> None:
        await mgr.set_uid_importance(os.getuid(), Importance.FOREGROUND)  # npud's uid: admin
        child = procs.spawn_as(None, None, app, str(runtime_dir))
        got = await asyncio.to_thread(child.wait, 30)
        assert got.startswith("RealtimeUnavailable") and "CAP_SYS_NICE" in got, got
        assert d.realtime.watch.grants == {}

    run_scenario(runtime_dir, scenario, **RT)


@pytest.mark.skipif(os.getuid() != 0, reason="needs CAP_SYS_NICE (root)")
def test_rt_the_watchdog_demotes_on_npuds_clock_and_at_the_connections_close(
        runtime_dir: Path) -> None:
    async def scenario(d: Daemon, mgr: AsyncNpuManager, log: Any, clock: VirtualClock) -> None:
        with pytest.raises(PermissionDenied, match="npud's own"):  # this very process
            # The bare call, not the SDK's: its backstop (hal/rt_backstop.prepare) would
            # lower this pytest worker's RLIMIT_RTTIME hard limit for life (root here cannot
            # raise it back), and every process it forks after would inherit the bound:
            # test_app_rt_backstop's unbounded client was refused for the wrong reason
            # when it ran after this test in the same worker.
            await mgr._do(calls.set_thread_realtime(threading.get_native_id()))
        await mgr.set_uid_importance(APP, Importance.FOREGROUND)
        child = procs.spawn_as(APP, None, app, str(runtime_dir))
        assert await asyncio.to_thread(child.expect, ("fifo", True)) == ("fifo", True)
        assert [g["pid"] for g in (await mgr.dump())["realtime"]["granted"]] == [child.pid]
        # The app's uid set to CACHED: the thread is taken back at the watchdog's next
        # sample on npud's clock, not before.
        await mgr.set_uid_importance(APP, Importance.CACHED)
        await settle()
        child.send("look")
        assert await asyncio.to_thread(child.expect, lambda e: e[0] == "fifo") == (
            "fifo", True)
        clock.advance(0.15)
        await settle()
        assert d.realtime.watch.demoted_total == {"not-foreground": 1}
        assert not _fifo(child.pid)
        child.send("close")
        assert await asyncio.to_thread(child.expect, lambda e: e[0] == "closed-fifo") == (
            "closed-fifo", False)
        assert d.realtime.watch.demoted_total == {"not-foreground": 1}
        assert await asyncio.to_thread(child.wait, 30) == "done"

    run_scenario(runtime_dir, scenario, **RT)


@pytest.mark.skipif(os.getuid() != 0, reason="needs CAP_SYS_NICE (root)")
def test_rt_closing_the_connection_demotes(runtime_dir: Path) -> None:
    async def scenario(d: Daemon, mgr: AsyncNpuManager, log: Any, clock: VirtualClock) -> None:
        child = procs.spawn_as(None, None, app, str(runtime_dir))
        await asyncio.to_thread(child.expect, ("fifo", True))
        child.send("look")
        assert await asyncio.to_thread(child.expect, lambda e: e[0] == "fifo") == (
            "fifo", True)  # no clock advance: still granted
        assert _fifo(child.pid)
        child.send("close")
        assert await asyncio.to_thread(child.expect, lambda e: e[0] == "closed-fifo") == (
            "closed-fifo", False)
        await asyncio.to_thread(child.wait, 30)
        assert d.realtime.watch.demoted_total == {"connection-closed": 1}

    run_scenario(runtime_dir, scenario, **RT)
