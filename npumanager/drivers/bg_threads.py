"""The driver host's background threads: which CPUs they may use, their kernel names,
and lowering them once at start (SCHED_IDLE, a nice value, or only around their runs).

Split out of .steps (the step runner keeps the pools these build): the same functions,
used by the step runner's pools, the compile pool (.prepare), the burst's end threads
(.bg_ends) and the lanes' CPU list (.messages).
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from npumanager.drivers.lowering import BACKGROUND_LOWER, arm_this_thread
from npumanager.hal.idle_cgroup import STEP, IdleGroup
from npumanager.hal.sched_slice import set_this_thread

log = logging.getLogger("npumanager.drivers.bg_threads")

BACKGROUND_SCHED = ("idle", "nice", "normal", "share")
BACKGROUND_CPUS = ("all", "spare", "lanes", "steer", "lanes-except-loads")
#: The choices that run background steps in lanes (.runqueue).
LANE_CHOICES = ("lanes", "steer", "lanes-except-loads")


def spare_cpus() -> set[int] | None:
    """Every CPU this process may use but its lowest, or None with fewer than two:
    where ``background_cpus = "spare"`` keeps background steps."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (OSError, AttributeError):
        return None
    return set(cpus[1:]) if len(cpus) >= 2 else None


def lane_cpus() -> list[int]:
    """The CPUs of ``background_cpus = "lanes"``: lane k's thread runs on the k-th CPU
    this process may use ([] with fewer than two: no lanes)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (OSError, AttributeError):
        return []
    return cpus if len(cpus) >= 2 else []


def _libc() -> Any:
    import ctypes

    try:
        return ctypes.CDLL(None)
    except OSError:
        return None


_LIBC = _libc()


def current_cpu() -> int | None:
    """The CPU the calling thread runs on now (sched_getcpu; None where libc lacks it)."""
    try:
        cpu = int(_LIBC.sched_getcpu())
    except AttributeError:
        return None
    return cpu if cpu >= 0 else None


def name_this_thread() -> None:
    """Give the calling thread its Python name's last part as its kernel name
    (``npu-bg_0``, ``npu-bgcompile_1``: the comm that ``top -H``, ``perf sched`` and
    bench/contention_trace.py show; every thread of the host is "python" otherwise).
    Best effort: PR_SET_NAME (15 characters) where libc has prctl."""
    import ctypes

    name = threading.current_thread().name.rsplit("-", 1)[-1]
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, f"npu-{name}"[:15].encode(), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def pin_this_thread(cpus: set[int] | None) -> None:
    """Keep the calling thread on ``cpus`` (None: leave it as it is)."""
    if cpus:
        try:
            os.sched_setaffinity(threading.get_native_id(), cpus)
        except OSError as exc:
            log.warning("a background thread stays on every CPU: %s", exc)


def lower_this_thread(sched: str, nice: int, cpus: set[int] | None = None,
                      group: IdleGroup | None = None, kind: str = STEP,
                      lower: str = "thread", slice_us: int = 0) -> None:
    """Lower the calling thread (Linux schedules threads, not processes: the tid).

    ``idle``: SCHED_IDLE, the kernel runs the thread only when no normal thread wants
    the core, so a foreground step (or the camera app itself) preempts it at once
    rather than sharing the core 50/50 as CFS does between nice-0 threads. ``nice``: a
    CFS weight of about 1.5 % at 19, for kernels or sandboxes without SCHED_IDLE.
    Threads ONNX Runtime creates later from this one inherit the policy. ``cpus``: the
    CPUs the thread may run on (None: all it may now). ``group``: the host's cpu.idle
    cgroup, which a thread of ``kind`` joins if it stays background for good
    (hal/idle_cgroup.py). ``lower = "run"``: the thread stays at normal priority and
    lowers itself only around its native work (.lowering); it joins no group then (the
    group would rank its Python, under the GIL, low again), unless it may not return
    from lowered, when it is lowered for good as with "thread". ``slice_us``: its EEVDF
    slice (``background_slice_us``; 0: the kernel's), set first: a SCHED_IDLE thread's
    cannot be set, one set before is kept (hal/sched_slice.py)."""
    name_this_thread()
    tid = threading.get_native_id()
    if slice_us:
        set_this_thread(slice_us, "background_slice_us")
    if cpus:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError as exc:
            log.warning("background threads stay on every CPU: %s", exc)
    if lower == "run" and sched in ("idle", "nice") and arm_this_thread(sched, nice):
        return
    if group is not None:
        group.join_this_thread(kind)
    try:
        if sched == "idle":
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        elif sched == "nice":
            os.setpriority(os.PRIO_PROCESS, tid, nice)
    except (OSError, AttributeError) as exc:  # a seccomp filter, a non-Linux kernel
        log.warning("background threads stay at normal priority: %s", exc)


def check_background(sched: str, lower: str) -> None:
    """ValueError naming the choices unless ``sched`` and ``lower`` are known values of
    background_sched and background_lower (the host's steps and every background pool)."""
    if sched not in BACKGROUND_SCHED:
        raise ValueError(f"background_sched must be one of {', '.join(BACKGROUND_SCHED)}, "
                         f"not {sched!r}")
    if lower not in BACKGROUND_LOWER:
        raise ValueError(f"background_lower must be one of {', '.join(BACKGROUND_LOWER)}, "
                         f"not {lower!r}")


def background_pool(workers: int, prefix: str, sched: str, nice: int,
                    cpus: set[int] | None = None, group: IdleGroup | None = None,
                    kind: str = STEP, lower: str = "thread",
                    slice_us: int = 0) -> ThreadPoolExecutor:
    check_background(sched, lower)
    return ThreadPoolExecutor(workers, thread_name_prefix=prefix,
                              initializer=lower_this_thread,
                              initargs=(sched, nice, cpus, group, kind, lower, slice_us))
