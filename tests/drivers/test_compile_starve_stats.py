"""How many times the compile child's starvation bound raised it, as ``device.stats``
reports it (``compile_child``: ``starve_ms``, ``raises``; drivers/compile_starve.py).

The starvation is scripted, not made by load: the test SIGSTOPs the real compile child
before a background compile, so its wall time runs while its CPU time does not, exactly
what a child kept off the CPU looks like to the host. The host raises it past the bound,
lowers it after one bound, and counts each raise; continued, the compile completes with
the right outputs. Raising needs the host to be allowed (root, or RLIMIT_NICE 20: systemd's
``LimitNICE=+0``); without that the bound is off and ``starve_ms`` says 0."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from npumanager.drivers.compile_starve import CompileStarve, can_raise
from npumanager.drivers.compile_worker import CompileWorker
from npumanager.hal.wire import SERVICE
from npumanager.paths import driver_socket
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.testing.driver_host import running_driver
from npumanager.testing.thread_sched import thread_scheds
from npumanager.wire.client import SyncRpcClient
from tests.drivers.test_compile_worker import mlp, wait_state

STARVE_MS = 50


def test_counts_name_the_bound_and_the_raises() -> None:
    """Virtual time: a child whose CPU time never moves is raised once per two bounds."""
    guard = CompileStarve(0.05)
    assert guard.counts() == {"starve_ms": 50.0, "raises": 0}
    guard.begin(0.0, 0.0)
    moves = [guard.tick(t / 100, 0.0) for t in range(1, 31)]  # 10 ms apart, 300 ms
    assert moves.count(True) == guard.boosts == guard.counts()["raises"] == 3
    assert CompileStarve(0.0).counts() == {"starve_ms": 0.0, "raises": 0}


needs_raise = pytest.mark.skipif(
    not can_raise(), reason="this process may not raise a child from SCHED_IDLE (not root, "
    "RLIMIT_NICE below 20): the bound is off")


def _lowered_soon(pid: int, within_s: float = 10.0) -> bool:
    """Every thread of ``pid`` back at SCHED_IDLE within ``within_s``. Not at once: on a
    loaded machine the compile may have starved again just before it ended, and then
    its child runs raised for one bound more (seen in a loaded full suite) before the
    bound lowers it."""
    deadline = time.monotonic() + within_s
    while (got := _policies(pid)) != {os.SCHED_IDLE}:
        if time.monotonic() > deadline:
            print("policies of the child's threads:", got)
            return False
        time.sleep(0.01)
    return True


def _policies(pid: int) -> set[int]:
    """The scheduling policies of ``pid``'s threads. A thread that exits between the
    listing and the read (one of ONNX Runtime's, seen once under a loaded full suite:
    ProcessLookupError) has no policy left to check: it is skipped."""
    return {policy for policy, _nice in thread_scheds(pid).values()}


def _compile(worker: CompileWorker, onnx: bytes) -> list[bytes]:
    blobs, _views = worker.compile(onnx, level=99, threads=1, n_model=1, n_data=1,
                                   max_bytes=1 << 30)
    return blobs


@needs_raise
def test_a_stopped_compile_child_is_raised_counted_and_its_compile_completes() -> None:
    """The watch runs on the compiling thread (here the test's, at normal priority: in the
    host it is a lowered pool thread, which a busy machine slows)."""
    worker = CompileWorker("starve-stats", "idle", 10, starve_ms=STARVE_MS)
    try:
        _compile(worker, mlp())  # starts the child
        assert worker.pid is not None
        # (That first compile may have starved already: the suite keeps the machine busy.)
        before = worker.starve.counts()["raises"]
        assert worker.starve.counts()["starve_ms"] == STARVE_MS
        guard = CompileStarve(worker.starve.starve_s)
        guard.boosts = int(before)
        worker.starve = guard
        # Stopped before the request is sent, so the compile cannot end until the test
        # continues it, however fast or slow the machine. (Stopped from the watch's begin,
        # after the send, the idle child compiled the small model first once in a loaded
        # full suite: the test's thread was off the CPU between the send and the signal.)
        os.kill(worker.pid, signal.SIGSTOP)
        wait_state(worker.pid, True)
        got: list[list[bytes]] = []
        th = threading.Thread(target=lambda: got.append(_compile(worker, mlp(seed=5))))
        th.start()
        try:
            deadline = time.monotonic() + 60
            while guard.boosts < before + 2:  # raised, lowered, raised again
                assert time.monotonic() < deadline, guard
                assert th.is_alive() and not got, "a stopped child compiled"
                time.sleep(0.01)
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        th.join(120)
        assert not th.is_alive() and got and got[0], "the compile did not complete"
        assert guard.counts()["raises"] >= before + 2
        assert _lowered_soon(worker.pid)
    finally:
        worker.close()


class StoppedAtSpawn(CompileWorker):
    """A worker whose child is SIGSTOPped the moment it is started: it never gets to its
    receipt (nor to importing ONNX Runtime) until the test continues it, which is what a
    child kept off the CPU from its start looks like to the host."""

    def _start(self) -> None:
        super()._start()
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGSTOP)
        wait_state(self._proc.pid, True)


@needs_raise
def test_a_child_starved_before_its_receipt_is_raised() -> None:
    """The watch starts when the child does, not when it acknowledges the request: a child
    starved from its start is raised past the bound (then lowered, raised again) while
    the request still waits for its receipt; continued, the compile completes and the
    child ends lowered."""
    worker = StoppedAtSpawn("starve-spawn", "idle", 10, starve_ms=STARVE_MS)
    got: list[list[bytes]] = []
    th = threading.Thread(target=lambda: got.append(_compile(worker, mlp(seed=7))))
    th.start()
    try:
        deadline = time.monotonic() + 30
        while worker.starve.boosts < 2:  # raised, lowered, raised again: no receipt yet
            assert time.monotonic() < deadline, f"never raised before its receipt: {worker.starve}"
            assert th.is_alive() and not got, "a stopped child compiled"
            time.sleep(0.01)
        assert worker.started == 1
    finally:
        if worker.pid is not None:
            os.kill(worker.pid, signal.SIGCONT)
    try:
        th.join(120)
        assert not th.is_alive() and got and got[0], "the compile did not complete"
        assert worker.pid is not None
        assert _lowered_soon(worker.pid)
    finally:
        worker.close()


def _stats(runtime_dir: Path) -> dict[str, Any]:
    rpc = SyncRpcClient(str(driver_socket("reference", runtime_dir)), SERVICE)
    try:
        payload, _ = rpc.call("device.stats", Empty())  # root or the host's owner: admin
        return dict(json.loads(payload))
    finally:
        rpc.close()


@pytest.mark.slow
def test_device_stats_reports_the_compile_childs_bound(runtime_dir: Path, state_dir: Path,
                                                       tmp_path: Path) -> None:
    cfg = tmp_path / "npu.toml"
    cfg.write_text('[[driver]]\nname = "reference"\nplugin = "reference"\n'
                   f'background_sched = "idle"\nbackground_starve_ms = {STARVE_MS}\n')
    with running_driver("reference", runtime_dir, state_dir, config=cfg,
                        args=["--no-enforce-admission"], timeout=60):
        got = _stats(runtime_dir)["compile_child"]
    # The host runs as this test's user: the bound is on where this process may raise.
    assert got == {"starve_ms": float(STARVE_MS) if can_raise() else 0.0, "raises": 0,
                   "via": "self" if can_raise() else "none"}, got
