"""``model.burst(realtime=True)``: npud's real-time grant for the thread that executes.

A camera's frame thread blocks for the driver's answer and is then woken; while a model
loads, the woken thread waits for a CPU behind normal threads (#15's ``after`` column of
``bench/contention.py --frame-split``). An app cannot put its own thread at SCHED_FIFO
(its RLIMIT_RTPRIO is 0), so the burst asks npud (``set_thread_realtime``, service/
rt_apps.py) once per executing thread, on a connection of its own that lives as long as
the burst: closing the burst ends the grant. A refusal (not FOREGROUND, over the bound,
the feature off, a kernel that refuses, a process that cannot bound its real-time threads:
hal/rt_backstop.py) is logged once per process and the burst goes on without real-time
priority.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

from npumanager import paths
from npumanager.errors import NpuError
from npumanager.hal import rt_backstop
from npumanager.proto.v1.manager_pb2 import RealtimeGrant, ThreadRealtime
from npumanager.wire.client import SyncRpcClient

log = logging.getLogger("npumanager.nn")
_warned = threading.Lock()


class RealtimeLink:
    """A connection to npud that asks for real-time priority for the calling thread."""

    def __init__(self, runtime_dir: str | os.PathLike[str] | None) -> None:
        self.path = str(paths.manager_socket(runtime_dir))
        self._rpc: SyncRpcClient | None = None
        #: The last refusal, if any (what ``Burst.realtime_error`` says).
        self.error: NpuError | None = None
        #: Threads this link got at FIFO (lowered when it ends).
        self._tids: set[int] = set()
        # The SIGXCPU backstop now, if this is the main thread (a burst is usually opened
        # there and executed elsewhere, where Python cannot install a signal handler); a
        # process that cannot have it is refused at the first ask.
        with contextlib.suppress(NpuError):
            rt_backstop.install()

    def ask(self) -> bool:
        """The calling thread to SCHED_FIFO; True when npud granted it."""
        tid = threading.get_native_id()
        try:
            rt_backstop.prepare(tid)  # (this process bounded first: hal/rt_backstop.py)
            if self._rpc is None or self._rpc.closed:
                # Threaded: its reader sees npud go at once, and the threads it got at
                # FIFO are lowered then (no npud watches them any more).
                self._rpc = SyncRpcClient(self.path, "manager", client_name="realtime",
                                          on_close=lambda exc: self._lower())
            payload, _ = self._rpc.call("set_thread_realtime", ThreadRealtime(tid=tid))
        except NpuError as exc:
            rt_backstop.refused(tid)
            self.error = exc
            if _warned.acquire(blocking=False):
                log.warning("model.burst(realtime=True): thread %d goes on without "
                            "real-time priority: %s: %s", tid, type(exc).__name__, exc)
            return False
        got = RealtimeGrant.FromString(payload)
        self._tids.add(tid)
        if self._rpc is None or self._rpc.closed:
            self._lower()
        log.debug("thread %d at SCHED_FIFO %d", tid, got.priority)
        return True

    def _lower(self) -> None:
        tids, self._tids = self._tids, set()
        if tids:
            rt_backstop.lower(tids)

    def close(self) -> None:
        """Ends every grant this link asked for (npud demotes them, and so does this side)."""
        if self._rpc is not None:
            self._rpc.close()
            self._rpc = None
        self._lower()
