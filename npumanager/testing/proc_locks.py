"""Who holds and who waits for a ``flock`` on a file, read from /proc/locks: tests see a
process queue for the one-queue device token (drivers/device_queue.py) without timing it.
"""

from __future__ import annotations

import os
import time


def flock_pids(*paths: str) -> tuple[set[int], set[int]]:
    """(holders, waiters): pids with a FLOCK on any of ``paths``, granted or blocked."""
    want = set()
    for path in paths:
        st = os.stat(path)
        want.add((os.major(st.st_dev), os.minor(st.st_dev), st.st_ino))
    held: set[int] = set()
    waiting: set[int] = set()
    with open("/proc/locks") as f:
        for line in f:
            parts = line.split()
            blocked = len(parts) > 1 and parts[1] == "->"
            fields = parts[2:] if blocked else parts[1:]
            # FLOCK ADVISORY WRITE PID MAJ:MIN:INODE START END
            if len(fields) < 5 or fields[0] != "FLOCK":
                continue
            major, minor, ino = fields[4].split(":")
            if (int(major, 16), int(minor, 16), int(ino)) in want:
                (waiting if blocked else held).add(int(fields[3]))
    return held, waiting


def queue_files(path: str) -> list[str]:
    """The one-queue device token's files (drivers/device_queue.py)."""
    from npumanager.drivers.device_queue import SLOTS

    return [path, *(f"{path}.{k}" for k in range(SLOTS))]


def queue_pids(path: str) -> tuple[set[int], set[int]]:
    """(in line, waiting) for the device token at ``path``: a taker holds its own slot
    from its ticket's draw until it is done, and waits on its predecessor's."""
    return flock_pids(*queue_files(path))


def wait_until_waiting(path: str, pid: int, timeout: float = 30.0) -> bool:
    """True once ``pid`` is blocked on the device token at ``path`` (False after
    ``timeout``)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pid in queue_pids(path)[1]:
            return True
        time.sleep(0.005)
    return False
