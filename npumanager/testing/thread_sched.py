"""What the kernel says of another process's threads and children, read from /proc: the
scheduling tests check the policy and nice value npud or a driver host really set, not what
the code meant to set."""

from __future__ import annotations

import os


def thread_scheds(pid: int, comm_prefix: str = "") -> dict[int, tuple[int, int]]:
    """Thread id -> (scheduling policy, nice value) of process ``pid``'s threads (those whose
    kernel name starts with ``comm_prefix``). A thread that exits between the listing and
    the read (ONNX Runtime's pool threads come and go) has nothing left to check: skipped."""
    out = {}
    for tid in map(int, os.listdir(f"/proc/{pid}/task")):
        try:
            if comm_prefix:
                with open(f"/proc/{pid}/task/{tid}/comm") as f:
                    if not f.read().startswith(comm_prefix):
                        continue
            out[tid] = (os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid))
        except (ProcessLookupError, FileNotFoundError):
            continue
    return out


def children(pid: int) -> list[int]:
    """Process ``pid``'s child processes (each of its threads' ``children``)."""
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out
