"""glibc's mmap threshold for the driver host and its compile child (hal/malloc_tune.py,
``malloc_mmap_threshold_kb``): with it fixed, a model-sized buffer freed in one thread
goes back to the kernel, and the next one of that size is a mapping again instead of a
piece of that thread's heap that stays after it is freed. Real processes, real glibc,
read from /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from npumanager.drivers.compile_worker import CompileWorker
from npumanager.hal.malloc_tune import set_mmap_threshold

#: Allocates and frees 24 MiB blocks in a thread; prints its anonymous memory (KiB) after
#: the frees. With glibc's sliding threshold the first free raises it past 24 MiB and the
#: later blocks come from the thread's heap, kept once freed.
_CHILD = """
import ctypes, sys, threading
from npumanager.hal.malloc_tune import set_mmap_threshold
set_mmap_threshold(int(sys.argv[1]))
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def work():
    for _ in range(6):
        blocks = [libc.malloc(24 << 20) for _ in range(3)]
        for b in blocks:
            ctypes.memset(b, 1, 24 << 20)  # touched: resident
        for b in blocks:
            libc.free(b)
t = threading.Thread(target=work); t.start(); t.join()
with open("/proc/self/status") as f:
    print(next(int(l.split()[1]) for l in f if l.startswith("RssAnon:")))
"""


def _anon_after_frees(kb: int) -> int:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(kb)], capture_output=True,
                         text=True, check=True, timeout=120)
    return int(out.stdout.strip())


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc")
def test_a_fixed_threshold_gives_freed_model_sized_buffers_back() -> None:
    if not set_mmap_threshold(4096):
        pytest.skip("this libc has no mallopt (not glibc)")
    sliding, fixed = _anon_after_frees(0), _anon_after_frees(4096)
    # 72 MiB allocated three at a time, all freed: kept in the heap vs given back.
    assert sliding - fixed > 40 * 1024, (sliding, fixed)


def test_zero_leaves_glibc_alone_and_the_compile_child_gets_the_setting() -> None:
    assert set_mmap_threshold(0) is False
    worker = CompileWorker("t", "nice", 10, mmap_threshold_kb=2048)
    try:
        worker._start()
        assert worker.pid is not None
        # Right after the fork the child may not have exec'd yet (its cmdline is then the
        # parent's, or empty mid-exec): wait for the worker's own command line.
        deadline = time.monotonic() + 60
        while True:
            with open(f"/proc/{worker.pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if any(b"compile_worker" in a for a in argv) or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        # (module, socket fd, sched, nice, the threshold, then background_slice_us: 0, the
        # slice inherited)
        at = argv.index(b"npumanager.drivers.compile_worker")
        assert argv[at + 4:at + 6] == [b"2048", b"0"], argv
    finally:
        worker.close()
