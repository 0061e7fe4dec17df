"""Whose CPU time a contention phase saw: the run's own processes, or someone else's.

A contention run measures tail latency on a small machine; a compiler or test
run of another user during a phase moves the camera's p99 more than any driver
setting does (the unmanaged camera's contended p99 ranged from 0.6 to 12.5 ms
between runs of the same code). So each phase records the machine's busy CPU
time (``/proc/stat``), the part of it spent by this process and everything it
started (``/proc/PID/stat`` utime + stime over the process tree), and the
hypervisor's steal time: a phase with a lot of *foreign* CPU is not a
measurement of the run, and the table says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


def _machine() -> tuple[int, int]:
    """(busy, steal) jiffies over all CPUs: busy is everything but idle, iowait and
    steal (time the hypervisor gave to another guest is neither ours nor foreign)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq = fields[:7]
    steal = fields[7] if len(fields) > 7 else 0
    return user + nice + system + irq + softirq, steal


def _tree_jiffies(root: int, pids: list[int]) -> int:
    total = 0
    for pid in [root, *pids]:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat.rpartition(")")[2].split()
        # utime, stime (all of its threads), and cutime, cstime: children it reaped (a
        # compile worker that lived and ended inside the phase)
        total += int(rest[11]) + int(rest[12]) + int(rest[13]) + int(rest[14])
    return total


@dataclass(frozen=True)
class CpuMark:
    busy: int
    steal: int
    ours: dict[int, int]  # pid -> jiffies, this process and its descendants
    tick: float  # seconds per jiffy


def mark(descendants: list[int]) -> CpuMark:
    me = os.getpid()
    ours = {pid: _tree_jiffies(pid, []) for pid in [me, *descendants]}
    busy, steal = _machine()
    return CpuMark(busy, steal, ours, 1 / os.sysconf("SC_CLK_TCK"))


@dataclass(frozen=True)
class CpuUse:
    """CPU in a phase, in cores (seconds of CPU per second of the phase)."""

    ours: float
    foreign: float
    steal: float

    def cell(self) -> str:
        return f"{self.ours:.2f} / {self.foreign:.2f} / {self.steal:.2f}"


def between(a: CpuMark, b: CpuMark, seconds: float) -> CpuUse:
    """Our processes' CPU is counted for those alive at both marks (a process that
    started in between counts from zero, one that ended is lost: the phases keep
    their processes, so neither happens inside one)."""
    ours = sum(max(0, j - a.ours.get(pid, 0)) for pid, j in b.ours.items())
    busy = b.busy - a.busy
    scale = a.tick / max(seconds, 1e-9)
    return CpuUse(ours * scale, max(0, busy - ours) * scale, (b.steal - a.steal) * scale)
