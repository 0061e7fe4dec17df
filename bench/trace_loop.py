"""What the driver host's event loop runs while models load: py-spy samples of it.

Part of bench/contention_trace.py (``--pyspy``): ``py-spy record --nonblocking --gil``
over the loading phase samples the host's Python threads holding the GIL (without
stopping the process, which would stall the camera's burst thread too); this prints the
event loop thread's share (its GIL holds are what a burst thread waiting for the GIL
waits out) by the innermost npumanager function and by the leaf. py-spy is a process of
its own at normal priority, so a run with it is for the profile, not the camera's
latencies.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from typing import Any

#: Samples a second (py-spy's default is 100).
RATE = 250

_LINE = re.compile(r"^thread \((\d+)\)[^;]*;(.*) (\d+)$")


def start_pyspy(keep: str, phase: str, pid: int, seconds: float) -> subprocess.Popen[bytes]:
    out = os.path.join(keep, f"{phase}.pyspy.txt")
    return subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "-p", str(pid),
         "--nonblocking", "--threads", "--gil",
         "-r", str(RATE), "-d", str(int(seconds + 1)), "-f", "raw", "-o", out],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def print_loop(keep: str, phase: str, loop: int | None, role: Any, top: int = 15) -> None:
    path = os.path.join(keep, f"{phase}.pyspy.txt")
    if loop is None or not os.path.exists(path):
        return
    by_tid: dict[int, int] = defaultdict(int)
    own: dict[str, int] = defaultdict(int)
    leaf: dict[str, int] = defaultdict(int)
    with open(path) as f:
        for line in f:
            m = _LINE.match(line.strip())
            if not m:
                continue
            tid, frames, n = int(m.group(1)), m.group(2).split(";"), int(m.group(3))
            by_tid[tid] += n
            if tid != loop:
                continue
            ours = [fr for fr in frames if "npumanager" in fr or "/drivers/" in fr]
            own[ours[-1] if ours else frames[-1]] += n
            leaf[frames[-1]] += n
    total = sum(by_tid.values())
    n_loop = by_tid.get(loop, 0)
    print(f"{phase}: py-spy, samples holding the GIL: {total} in all, the event loop "
          f"{n_loop} ({RATE}/s: {n_loop / RATE * 1e3:.0f} ms of GIL)")
    roles: dict[str, int] = defaultdict(int)
    for tid, n in by_tid.items():
        roles[role(tid)] += n
    print("  GIL samples by thread: " + ", ".join(
        f"{k} {v}" for k, v in sorted(roles.items(), key=lambda x: -x[1])))
    for title, d in (("innermost npumanager frame", own), ("leaf", leaf)):
        print(f"  the loop's samples by {title}:")
        for k, v in sorted(d.items(), key=lambda x: -x[1])[:top]:
            print(f"    {v:6d} {k}")
