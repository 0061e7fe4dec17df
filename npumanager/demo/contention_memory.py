"""Memory of a contention run (:mod:`.contention`): the whole machine's in use
(``MemTotal - MemAvailable`` from /proc/meminfo) above what it was just before the
run, and the peak summed RSS of the processes the run started (found through /proc).
"""

from __future__ import annotations

import os
import threading


def _mem_used() -> int:
    info: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0]) * 1024
    return info["MemTotal"] - info.get("MemAvailable", info.get("MemFree", 0))


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class MemorySampler:
    """Peak machine memory in use (every 25 ms) and peak RSS of our descendants (250 ms)."""

    def __init__(self) -> None:
        self.base = _mem_used()
        self.peak = self.base
        self.rss_peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mem-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        me, n = os.getpid(), 0
        while not self._stop.wait(0.025):
            self.peak = max(self.peak, _mem_used())
            n += 1
            if n % 10 == 0:
                self.rss_peak = max(self.rss_peak, sum(_rss(p) for p in descendants(me)))

    def stop(self) -> tuple[float, float]:
        self._stop.set()
        self._thread.join(2)
        return (self.peak - self.base) / 2**20, self.rss_peak / 2**20
