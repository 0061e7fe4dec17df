"""A one-queue device, *emulated* on the CPU for benchmarks (bench/contention.py's
``unmanaged-1q`` and ``1q*`` rows; reference driver option ``device_queue_lock``).

A small NPU has one hardware queue: whoever submits, one job executes at a time, the
others wait in submission order, and nobody is preempted mid-job. Here that queue is a
machine-wide token taken around each native run (one ``session.run``, one step of a
multi-step job) by every process that uses it: the driver host's runs and, in the
unmanaged comparison, each app's own ONNX Runtime.

First come, first served, as a hardware queue is: a plain ``flock`` is not. Its waiters
are all woken at an unlock and the process that just let go, still running, mostly
takes it again: in a quick run on one plain flock the unmanaged embedder, running back
to back, got 3x the items/s of the managed one and the unmanaged camera waited 13.5 ms
at p99 contended, behind a string of someone else's runs. So the token is a queue lock
(CLH) built of flocks: a ticket drawn under a short lock on the queue file, a slot
file per ticket (``PATH.K``, K = ticket mod ``SLOTS``) held from the draw until the
holder is done, and each ticket waits for its predecessor's slot to be let go.

It is a model, not an accelerator: the runs still execute on this CPU, their threads
still compete for it with all that is not a run (Python, the client library, npud,
ONNX Runtime's pool threads spinning after a run), and a token costs a few system
calls (4 µs a run here when nobody waits; in both runs of a pair alike).
"""

from __future__ import annotations

import fcntl
import os
import threading

#: Slot files: more than ever wait at once (tickets K and K + SLOTS share one).
SLOTS = 32


def create(path: str) -> None:
    """The queue's files, usable by every uid (the bench's apps, the driver host's user):
    the queue file is written (the ticket counter), the slots only locked (read-only)."""
    for name, mode in ((path, 0o666), *((f"{path}.{k}", 0o644) for k in range(SLOTS))):
        fd = os.open(name, os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, mode)
        try:
            if os.fstat(fd).st_uid == os.geteuid():
                os.fchmod(fd, mode)  # past the umask
        finally:
            os.close(fd)


class DeviceQueue:
    """The queue at ``path`` (its files made by :func:`create` if missing). Each taking
    opens its own descriptors, so threads of one process queue in order like processes
    (a flock on a shared descriptor would not exclude its other users)."""

    def __init__(self, path: str) -> None:
        self.path = path
        if not all(os.path.exists(p) for p in (path, f"{path}.{SLOTS - 1}")):
            create(path)
        self._local = threading.local()

    def _open(self, ticket: int) -> int:
        return os.open(f"{self.path}.{ticket % SLOTS}", os.O_RDONLY | os.O_CLOEXEC)

    def acquire(self) -> None:
        meta = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        mine = -1
        try:
            fcntl.flock(meta, fcntl.LOCK_EX)  # held for a few system calls only
            raw = os.pread(meta, 8, 0)
            ticket = int.from_bytes(raw, "little") if len(raw) == 8 else 0
            # Our slot held before the ticket is published: whoever draws the next one
            # finds it taken until we are done.
            mine = self._open(ticket)
            fcntl.flock(mine, fcntl.LOCK_EX)
            os.pwrite(meta, (ticket + 1).to_bytes(8, "little"), 0)
        except BaseException:
            if mine >= 0:
                os.close(mine)
            raise
        finally:
            os.close(meta)  # the draw's lock goes with it
        try:
            before = self._open(ticket - 1)
            try:
                # Our turn once the predecessor lets go of its slot (at once if it has,
                # or for the first ticket ever). The wait lets go of the GIL.
                fcntl.flock(before, fcntl.LOCK_SH)
            finally:
                os.close(before)
        except BaseException:
            os.close(mine)
            raise
        self._local.fd = mine

    def release(self) -> None:
        fd = self._local.fd
        self._local.fd = -1
        os.close(fd)  # the slot's lock goes with it: the next ticket's turn

    def __enter__(self) -> DeviceQueue:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def close(self) -> None:
        """Nothing held between runs (kept for the engines' close)."""
