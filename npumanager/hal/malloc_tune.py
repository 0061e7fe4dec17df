"""glibc's mmap threshold for the driver host and its compile child (``malloc_mmap_threshold_kb``).

glibc serves an allocation at or above its mmap threshold with a mapping of its own,
unmapped (given back to the kernel) when freed; below it, from the heap (``brk`` or a
thread's arena), which keeps freed memory for reuse and returns it only from the top.
The threshold starts at 128 KiB and *slides*: each time a mapped block is freed, it rises
to that block's size (up to 32 MiB). A driver host loads and releases models again and
again: after the first free of a model-sized buffer, the next ones (the weights read back
from the compile child, ONNX Runtime's copies and prepacked layouts) come from the heaps
of whichever thread loaded them and stay there after the model is released. Measured
(one host, the contention bench's 32 MiB LLM loaded and released eight times beside a
resident camera and LLM): anonymous memory 146 MiB -> 262 MiB loaded and 262 released,
the compile child 80-112 MiB; with the threshold fixed at 4 MiB: 156 loaded, 124 released,
the child 40. Setting it (``mallopt(M_MMAP_THRESHOLD)``) also stops the sliding.

Best effort: where libc has no ``mallopt`` (musl) nothing changes.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("npumanager.hal.malloc_tune")

_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
#: glibc refuses thresholds above HEAP_MAX_SIZE / 2 (32 MiB on 64-bit).
MAX_THRESHOLD_KB = 32 * 1024


def set_mmap_threshold(kb: int) -> bool:
    """Fix this process's mmap threshold at ``kb`` KiB (0: leave glibc's sliding one).
    True if libc took it."""
    if kb <= 0:
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(_M_MMAP_THRESHOLD, min(kb, MAX_THRESHOLD_KB) * 1024))
    if not ok:
        log.warning("libc refused an mmap threshold of %d KiB", kb)
    return ok
