"""The one-queue device emulation (drivers/device_queue.py): one token across processes,
uids and threads, and the reference driver's every kind of native run holds it. Who
waits is read from /proc/locks (testing/proc_locks.py), never timed."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from npumanager.drivers.base import CompileOptions
from npumanager.drivers.device_queue import DeviceQueue
from npumanager.drivers.reference import ReferenceDriver
from npumanager.testing.onnx_models import relu_model
from npumanager.testing.proc_locks import queue_pids, wait_until_waiting

#: A process that takes the token, says so, and gives it back when told (a line on stdin).
HOLDER = """
import sys
from npumanager.drivers.device_queue import DeviceQueue
q = DeviceQueue(sys.argv[1])
print("asking", flush=True)
with q:
    print("held", flush=True)
    sys.stdin.readline()
print("released", flush=True)
"""


@pytest.fixture
def token() -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="npu-queue-test-")
    os.chmod(d, 0o755)  # another uid takes the token too
    path = os.path.join(d, "device-queue")
    try:
        yield path
    finally:
        for name in os.listdir(d):
            os.unlink(os.path.join(d, name))
        os.rmdir(d)


def _holder(path: str, user: int | None = None) -> subprocess.Popen[str]:
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.Popen([sys.executable, "-c", HOLDER, path], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, user=user,
                            env={**os.environ, "PYTHONPATH": src}, cwd="/")


def _said(p: subprocess.Popen[str]) -> bool:
    """Whether ``p`` wrote a line that is waiting to be read (no wait)."""
    assert p.stdout is not None
    return bool(select.select([p.stdout], [], [], 0)[0])


def test_a_second_process_waits_for_the_token_until_the_first_gives_it_back(
        token: str) -> None:
    first = _holder(token)
    assert first.stdout is not None and first.stdin is not None
    assert first.stdout.readline() == "asking\n" and first.stdout.readline() == "held\n"
    # Another uid when we are root: the bench's apps and its driver host each have theirs.
    second = _holder(token, user=65534 if os.getuid() == 0 else None)
    assert second.stdout is not None and second.stdin is not None
    try:
        assert second.stdout.readline() == "asking\n"
        assert wait_until_waiting(token, second.pid), "the second never queued for the token"
        # Both in line (each holds its own slot), the second waiting on the first's.
        assert queue_pids(token) == ({first.pid, second.pid}, {second.pid})
        assert not _said(second)  # still waiting: it has not printed "held"
        first.stdin.write("\n")
        first.stdin.flush()
        assert first.stdout.readline() == "released\n"
        assert second.stdout.readline() == "held\n"
        assert queue_pids(token) == ({second.pid}, set())
        second.stdin.write("\n")
        second.stdin.flush()
        assert second.stdout.readline() == "released\n"
    finally:
        for p in (first, second):
            p.kill()
            p.wait()
            for pipe in (p.stdin, p.stdout):
                if pipe is not None:
                    pipe.close()


def test_threads_of_one_process_wait_in_line_like_processes(token: str) -> None:
    """Each taking has descriptors of its own (a flock on one shared descriptor would let
    a second thread in): a thread of the holding process queues like another process."""
    q = DeviceQueue(token)
    q.acquire()
    got = threading.Event()

    def take() -> None:
        with q:
            got.set()

    t = threading.Thread(target=take)
    t.start()
    try:
        assert wait_until_waiting(token, os.getpid()), "the second thread never queued"
        assert not got.is_set()
    finally:
        q.release()
        t.join(10)
    assert got.is_set()
    assert queue_pids(token) == (set(), set())  # and it was given back


def test_waiters_are_served_in_the_order_they_came(token: str) -> None:
    """First come, first served, as a hardware queue: the process that lets go does not
    take the token straight back ahead of those already waiting (a plain flock's waiters
    race for it at each unlock), and tickets go round the slot files."""
    from npumanager.drivers.device_queue import SLOTS

    q = DeviceQueue(token)
    for _ in range(SLOTS + 3):  # past a wrap of the slots
        with q:
            pass
    q.acquire()
    order: list[int] = []
    threads = []
    for i in range(3):
        th = threading.Thread(target=lambda i=i: (q.acquire(), order.append(i), q.release()))
        th.start()
        threads.append(th)
        # The next comes only once this one waits, so the arrival order is known.
        assert _wait_for(lambda n=i + 1: len(_blocked(token)) == n), f"thread {i} never queued"
    q.release()
    q.acquire()  # the releasing thread asks again at once: it comes after the three
    order.append(-1)
    q.release()
    for th in threads:
        th.join(10)
    assert order == [0, 1, 2, -1]


def _wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> bool:
    import time

    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            return False
        time.sleep(0.001)
    return True


def _blocked(path: str) -> list[str]:
    from npumanager.testing.proc_locks import queue_files

    inodes = {str(os.stat(p).st_ino) for p in queue_files(path)}
    with open("/proc/locks") as f:
        return [ln for ln in f if " -> " in ln and ln.split()[6].split(":")[-1] in inodes]


def _runs(drv: ReferenceDriver) -> dict[str, tuple[Callable[[], dict[str, Any]], Any]]:
    m = drv.compile(relu_model((4, 8)), CompileOptions())
    x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)
    dest = np.zeros((4, 8), np.float32)
    bound = m.bind({"x": x}, {"y": dest})
    assert bound is not None
    return {"run": (lambda: m.run({"x": x}), np.maximum(x, 0)),
            "run_into": (lambda: m.run_into({"x": x}, {"y": np.zeros((4, 8), np.float32)}),
                         np.maximum(x, 0)),
            "bound": (bound, np.maximum(x, 0))}


@pytest.mark.parametrize("kind", ["run", "run_into", "bound"])
def test_the_reference_driver_holds_the_token_around_each_run(token: str, kind: str) -> None:
    drv = ReferenceDriver({"device_queue_lock": token})
    run, want = _runs(drv)[kind]
    np.testing.assert_array_equal(run()["y"], want)  # free: it runs at once
    busy = DeviceQueue(token)  # another user of the device has it
    busy.acquire()
    out: list[dict[str, Any]] = []
    t = threading.Thread(target=lambda: out.append(run()))
    t.start()
    try:
        assert wait_until_waiting(token, os.getpid()), f"{kind} never queued for the token"
        assert not out and t.is_alive()
    finally:
        busy.release()
        t.join(10)
    np.testing.assert_array_equal(out[0]["y"], want)
    assert queue_pids(token) == (set(), set())  # each run gave it back


def test_without_the_option_runs_take_no_token(token: str) -> None:
    drv = ReferenceDriver({})
    busy = DeviceQueue(token)
    busy.acquire()
    try:
        for run, want in _runs(drv).values():
            np.testing.assert_array_equal(run()["y"], want)  # while the token is held
    finally:
        busy.release()


def test_a_model_loaded_from_the_cache_holds_the_token_too(token: str) -> None:
    drv = ReferenceDriver({"device_queue_lock": token})
    compiled = drv.compile_with_artifacts(relu_model((4, 8)), CompileOptions())
    loaded = drv.load_artifacts(*compiled.artifacts(), CompileOptions())
    assert getattr(loaded, "queue", None) is drv.queue is not None
    assert getattr(compiled, "queue", None) is drv.queue
