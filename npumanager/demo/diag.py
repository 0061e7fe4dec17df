"""``kill -USR1`` on a running demo: every process's stacks and npud's log, on stderr.

A demo that seems stuck (a test's timeout, a user's terminal) is asked, not
killed: SIGUSR1 makes it write the stacks of its own threads, signal every
npumanager process it started (npud, the driver host, its compile worker, the
apps; each writes its stacks through :mod:`faulthandler`, registered by
``npu``'s entry point and by the compile worker), and then write npud's
output (which carries the driver host's) and each app's log, where the apps'
stacks land. The demo then carries on.

The Python handler only starts a thread; the demo's own stacks come from
faulthandler's C handler, chained in front of it, so they are written even
when the main thread is stuck in C code and the Python handler cannot run.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType
from typing import Any

#: How long the signalled processes get to write their stacks before the logs are read.
SETTLE_S = 1.5


def descendants(pid: int) -> list[int]:
    """The pids of ``pid``'s children, their children, and so on (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _ours(pid: int, own: bytes) -> bool:
    """An npumanager process: it has the SIGUSR1 stack dump (others would die of it). The
    apps are forks of the demo: their command line is the demo's (``npu demo``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return b"npumanager" in cmdline or cmdline == own


def write_report(logs: Callable[[], Iterable[tuple[str, str]]]) -> None:
    """Signal the demo's npumanager descendants, let them write, then print the logs.

    One at a time, in the order listed, so that stacks sharing a log (npud's output
    carries the driver host's and its compile worker's) come in that order too."""
    err = sys.stderr
    with open("/proc/self/cmdline", "rb") as f:
        own = f.read()
    pids = [p for p in descendants(os.getpid()) if _ours(p, own)]
    err.write(f"\n=== npu demo {os.getpid()}: stacks of its processes, in this order ===\n")
    for pid in pids:
        err.write(f"{pid}: {_cmdline(pid)[:120]}\n")
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGUSR1)
        time.sleep(SETTLE_S / 5)
    err.flush()
    time.sleep(SETTLE_S)
    for title, text in logs():
        err.write(f"\n=== {title} ===\n{text}\n")
    err.write("=== end of the demo's report ===\n")
    err.flush()


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return "?"


def install(logs: Callable[[], Iterable[tuple[str, str]]]) -> Callable[[], None]:
    """Make SIGUSR1 write the report; returns the function that undoes it."""
    faulthandler.unregister(signal.SIGUSR1)

    def on_usr1(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=write_report, args=(logs,), name="demo-diag",
                         daemon=True).start()

    old = signal.signal(signal.SIGUSR1, on_usr1)
    faulthandler.register(signal.SIGUSR1, file=2, all_threads=True, chain=True)

    def uninstall() -> None:
        faulthandler.unregister(signal.SIGUSR1)
        signal.signal(signal.SIGUSR1, old)

    return uninstall


def in_app() -> None:
    """In a forked app: SIGUSR1 writes its own stacks to its stderr (its log), and runs
    none of the demo's handler it inherited."""
    faulthandler.unregister(signal.SIGUSR1)
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    faulthandler.register(signal.SIGUSR1, file=2, all_threads=True)  # fd 2: its log


def read_tail(path: str | Path, limit: int = 200_000) -> str:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        return f"(cannot read: {exc})"
    return data[-limit:].decode(errors="replace")


def logs(npud: Any, apps: dict[str, Any], app_dir: str) -> list[tuple[str, str]]:
    """The demo's part of the report: npud's output (the driver host's stderr is npud's)
    and each app's log (its stderr, where its stacks go)."""
    out = []
    if npud is not None:
        out.append((f"npud {npud.pid} output", "\n".join(list(npud.lines))))
    for name, proc in list(apps.items()):
        out.append((f"{name} (pid {proc.pid}) log",
                    read_tail(os.path.join(app_dir, f"{name}.log"))))
    return out
