"""A thread's EEVDF slice: ``sched_setattr(2)``'s ``sched_runtime`` for a SCHED_OTHER thread.

Linux 6.12+ schedules normal threads with EEVDF: each has a slice (here 1.4 ms unless set),
its virtual deadline is its eligible time plus that slice, and the kernel picks the
eligible thread with the earliest deadline. A thread with a shorter slice gets an earlier
deadline, and with the ``PREEMPT_SHORT`` feature (on by default since 6.12) a woken
short-slice thread may preempt the running one before that one's slice ends. On a kernel
built ``PREEMPT_NONE`` with HZ 250 the running thread otherwise keeps the CPU up to the
next tick (4 ms): the tails #15's traces showed on the camera's path (bench/README.md: "Per-task
slices").

``sched_setattr`` sets the policy, nice value and slice together, so :func:`set_slice`
reads the thread's own first (``sched_getattr``) and keeps them. The kernel clamps a
slice to 0.1..100 ms and, for ``sched_runtime = 0``, goes back to its own; values
outside are refused here (:class:`~npumanager.errors.InvalidArgument`) rather than
silently clamped. What the kernel does not take comes back as a :class:`SliceSet` whose
``ok`` is False with the reason: no such syscall (not Linux, or a seccomp filter: ENOSYS,
EPERM), an older kernel (E2BIG, EINVAL; or one that takes ``sched_runtime`` and ignores
it for a normal thread: the slice read back differs), a SCHED_IDLE/RT thread (6.18 takes
the call and leaves an idle thread's slice as it was: only SCHED_OTHER and SCHED_BATCH
threads get one). Any uid may set its own threads' slices (tests/security/
test_sched_slice.py, under a real unprivileged uid): a slice is a latency hint, not more
CPU (the thread's weight is unchanged).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import struct
import threading
from dataclasses import dataclass

from npumanager.errors import InvalidArgument

log = logging.getLogger("npumanager.hal.sched_slice")

#: The kernel's clamp for a custom slice (kernel/sched/syscalls.c), in µs.
MIN_SLICE_US = 100
MAX_SLICE_US = 100_000

#: (sched_setattr, sched_getattr) by machine (x86_64 and aarch64; others: none).
_SYSCALLS = {"x86_64": (314, 315), "amd64": (314, 315), "aarch64": (274, 275),
             "arm64": (274, 275)}
#: struct sched_attr, SCHED_ATTR_SIZE_VER0: size, policy, flags, nice, priority,
#: runtime, deadline, period.
_ATTR = struct.Struct("IIQiIQQQ")
#: The policies with a slice of their own (SCHED_OTHER, SCHED_BATCH).
_SLICED = (0, 3)
_SCHED_FLAG_RESET_ON_FORK = 0x01


@dataclass(frozen=True, slots=True)
class SliceSet:
    """What :func:`set_slice` did: ``ok`` (truthy) when the thread's slice is now the one
    asked for; ``before_ns`` and ``after_ns`` its slice read before and after (0 where
    unknown); ``why``: where not ok, what refused it."""

    ok: bool
    before_ns: int = 0
    after_ns: int = 0
    why: str = ""

    def __bool__(self) -> bool:
        return self.ok


def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()
_NUMBERS = _SYSCALLS.get(platform.machine().lower())
_warned = threading.Lock()


def check_slice_us(us: float) -> int:
    """``us`` as a whole number of µs, 0 (the kernel's own) or MIN..MAX_SLICE_US;
    InvalidArgument otherwise."""
    if isinstance(us, bool) or not isinstance(us, int | float) or us != us:
        raise InvalidArgument(f"a slice is a number of µs, not {us!r}")
    n = int(us)
    if n != 0 and not MIN_SLICE_US <= n <= MAX_SLICE_US:
        raise InvalidArgument(f"a slice must be 0 (the kernel's) or {MIN_SLICE_US}.."
                              f"{MAX_SLICE_US} µs, not {us!r}")
    return n


def _call(nr: int, tid: int, buf: ctypes.Array[ctypes.c_char], *rest: int) -> int:
    """The syscall's errno (0: it took it)."""
    if _LIBC is None:
        return errno.ENOSYS
    try:
        rc = int(_LIBC.syscall(nr, tid, buf, *rest))
    except AttributeError:
        return errno.ENOSYS
    return 0 if rc == 0 else (ctypes.get_errno() or errno.EINVAL)


def get_attr(tid: int = 0) -> tuple[int, int, int, int] | None:
    """(policy, flags, nice, slice in ns) of thread ``tid`` (0: the calling thread), or
    None where the kernel has no sched_getattr (or another uid's thread is hidden)."""
    if _NUMBERS is None:
        return None
    buf = ctypes.create_string_buffer(_ATTR.size)
    if _call(_NUMBERS[1], tid, buf, _ATTR.size, 0):
        return None
    _size, policy, flags, nice, _prio, runtime, _dl, _period = _ATTR.unpack(buf.raw)
    return policy, flags, nice, runtime


def slice_ns(tid: int = 0) -> int | None:
    """Thread ``tid``'s slice in ns (0: the calling thread); None where unknown (a kernel
    before 6.12 reads back 0 for a normal thread)."""
    attr = get_attr(tid)
    return attr[3] if attr is not None else None


def set_slice(us: float, tid: int = 0) -> SliceSet:
    """Set thread ``tid``'s slice to ``us`` µs (0: back to the kernel's own), keeping its
    policy and nice value. InvalidArgument for a value outside 0, MIN..MAX_SLICE_US; a
    SliceSet whose ``ok`` is False where the kernel refuses or ignores it."""
    n = check_slice_us(us)
    if tid == 0:
        tid = threading.get_native_id()
    if _NUMBERS is None:
        return SliceSet(False, why=f"no sched_setattr on {platform.machine()}")
    attr = get_attr(tid)
    if attr is None:
        return SliceSet(False, why="sched_getattr refused (kernel older than 3.14, or a "
                        "seccomp filter)")
    policy, flags, nice, before = attr
    if policy not in _SLICED:
        return SliceSet(False, before, before,
                        f"policy {policy} has no slice of its own (SCHED_OTHER or "
                        "SCHED_BATCH only: set it before lowering a thread to SCHED_IDLE)")
    want = n * 1000
    buf = ctypes.create_string_buffer(
        _ATTR.pack(_ATTR.size, policy, flags & _SCHED_FLAG_RESET_ON_FORK, nice, 0, want, 0, 0),
        _ATTR.size)
    err = _call(_NUMBERS[0], tid, buf, 0)
    if err:
        return SliceSet(False, before, before, f"sched_setattr: {os.strerror(err)}")
    after = slice_ns(tid) or 0
    if n and after != want:  # (0: the kernel's own, whatever it is)
        return SliceSet(False, before, after, f"the kernel kept a slice of {after} ns "
                        f"(older than 6.12: sched_runtime ignored for a normal thread)")
    return SliceSet(True, before, after)


def set_this_thread(us: float, what: str) -> bool:
    """Best effort for a thread of ours: set the calling thread's slice to ``us`` µs; True
    if the kernel took it. A refusal is logged once per process (``what`` names the
    setting) and the thread goes on with the kernel's slice."""
    if not us:
        return False
    got = set_slice(us)
    if not got.ok and _warned.acquire(blocking=False):
        log.warning("%s = %g: the kernel's own slice stays (%s)", what, us, got.why)
    return got.ok
