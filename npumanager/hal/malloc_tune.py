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


#: ``compile_malloc``'s choices: glibc tunables (``GLIBC_TUNABLES``) for the compile child.
#: A compile faults in every model-sized buffer afresh: with the 4 MiB threshold each is a
#: mapping of its own, unmapped when freed, and the next compile's buffers are zeroed and
#: faulted in again, 4 KiB at a time (bench/load_cpu.py: the child 86 % system time,
#: 131 k minor faults a second while the contention bench's 32 MiB LLM loads again and
#: again, 57 % of its samples in page faults). "keep": no mappings at all (``mmap_max=0``)
#: and no trimming of the heap, so the next compile reuses the memory the last one freed
#: (the child keeps its peak while compiles come back to back, and gives it back once idle
#: for ``KEEP_IDLE_S``: compile_worker.py); "hugepages": glibc asks for transparent huge pages
#: (``madvise``) on the memory it maps or grows, so a fault brings 2 MiB, not 4 KiB
#: (the kernel's ``transparent_hugepage`` set to ``madvise`` or ``always``);
#: "keep-hugepages": both. Measured (bench/README.md: ``compile_malloc``): "keep" makes the bench's
#: loads a third faster at half the child's CPU; the camera's tail while a model loads
#: did not move beyond the spread in three full paired runs, so an opt-in.
COMPILE_MALLOC: dict[str, str] = {
    "default": "",
    "keep": f"glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold={1 << 62}",
    "hugepages": "glibc.malloc.hugetlb=1",
    "keep-hugepages": f"glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold={1 << 62}"
                      ":glibc.malloc.hugetlb=1",
}


#: A "keep" compile child idle this long gives its kept memory back (``trim``).
KEEP_IDLE_S = 1.0


def trim() -> bool:
    """Give the heap's free memory back to the kernel (``malloc_trim(0)``: the top of each
    heap, and whole free pages inside them). True if some was released."""
    try:
        libc = ctypes.CDLL(None)
        malloc_trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    malloc_trim.argtypes = [ctypes.c_size_t]
    malloc_trim.restype = ctypes.c_int
    return bool(malloc_trim(0))


def tunables_env(mode: str, env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``GLIBC_TUNABLES`` for ``compile_malloc = mode`` added to any already
    there (a copy; ``env`` itself when the mode adds nothing). ValueError for an unknown
    mode."""
    if mode not in COMPILE_MALLOC:
        raise ValueError(f"compile_malloc must be one of {', '.join(COMPILE_MALLOC)}, "
                         f"not {mode!r}")
    add = COMPILE_MALLOC[mode]
    if not add:
        return env
    old = env.get("GLIBC_TUNABLES", "")
    return {**env, "GLIBC_TUNABLES": f"{old}:{add}" if old else add}
