"""The supervisor's record of each device it serves: a driver host's socket, connection,
process and restart back-off (:mod:`.supervisor`).

A [[driver]] entry serving several devices (hal/host_config.device_entries) is one host
process with a socket per device; each device is a :class:`DriverSlot` of its own, and
the first (the leader) starts, restarts and stops the process for all of them.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from npumanager.clock import LoopClock, wait_first
from npumanager.paths import lane_name
from npumanager.proto.v1.common_pb2 import DeviceInfo
from npumanager.service.driver_launch import DriverLaunch
from npumanager.service.hand_ties import HandTie
from npumanager.service.host_process import HostProcess
from npumanager.service.host_records import HostRecord
from npumanager.wire.conn import RpcConnection

log = logging.getLogger("npumanager.service.supervisor")


@dataclass
class Backoff:
    """Restart delays: ``first`` doubling up to ``maximum``; reset after a stable run."""

    first: float
    maximum: float
    stable_s: float = 10.0
    current: float = 0.0

    def next_delay(self, up_for_s: float) -> float:
        if up_for_s >= self.stable_s or self.current == 0.0:
            self.current = self.first
        else:
            self.current = min(self.current * 2, self.maximum)
        return self.current


@dataclass(eq=False)
class DriverSlot:
    name: str
    number: int
    entry: dict[str, Any]
    backoff: Backoff
    info: DeviceInfo
    proc: HostProcess | None = None
    launch: DriverLaunch | None = None
    conn: RpcConnection | None = None
    up: bool = False
    up_since: float = 0.0
    starts: int = 0
    temperature: float | None = None
    last_exit: str = ""
    #: The pid of a host an earlier npud started that this one attached to (not our child).
    adopted_pid: int = 0
    #: npud's record tying that host to the npud that started it, or (one started by hand)
    #: the pidfd of its socket's listener, or why there is neither (service/hand_ties.py:
    #: its threads get real-time grants only with one).
    adopted_record: HostRecord | HandTie | str = ""
    task: asyncio.Task[None] | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    #: A host serving several devices (hal/host_config.device_entries) is one process with
    #: a socket per device; each device is a slot of its own (its own connection, grants,
    #: thermal status, budget in npud). Its first device's slot, the leader, starts and
    #: stops the process; ``leader`` is that slot for the others (None: this slot is the
    #: process's). ``group``: the leader's devices, itself first.
    leader: DriverSlot | None = None
    group: list[DriverSlot] = field(default_factory=list)
    #: (leader) Set while its process serves; ``generation`` counts its starts.
    host_ready: asyncio.Event = field(default_factory=asyncio.Event)
    generation: int = 0
    #: Why the last attach to a host that still listens failed without a refusal (it did
    #: not answer in time); "": no such host, or it refused.
    unanswered: str = ""
    #: The keys in which the host npud attached to, one it did not start, runs another
    #: entry than npud would run it with (service/host_entries.py); empty: none.
    entry_differs: list[str] = field(default_factory=list)
    #: Clear while a host this slot spawned is starting (spawned, not yet attached); set
    #: once it is attached or the attempt ended. A detaching npud waits on it.
    settled: asyncio.Event = field(default_factory=asyncio.Event)
    #: Which of its device's host processes this slot runs: "" (the main one) or
    #: "background" (the second, [[driver]] background_host: service/host_lanes.py).
    lane: str = ""
    #: (main) The device's background lane slot, if it has one; (lane) its main slot.
    background: DriverSlot | None = None
    main: DriverSlot | None = None
    #: Ended grants whose release this host has not acknowledged yet (npud asked it).
    acks: set[str] = field(default_factory=set)
    #: (lane) Its "is up" log line (format, args), held until its main host's first start
    #: has ended (HostLanes.say_up); None: nothing held.
    unsaid_up: tuple[str, tuple[object, ...]] | None = None

    def __post_init__(self) -> None:
        self.settled.set()

    @property
    def sock_name(self) -> str:
        """Its socket, record and state-dir name: ``NAME`` or ``NAME.background``."""
        return lane_name(self.name, self.lane)

    @property
    def label(self) -> str:
        """For logs and `npu status`: ``NAME`` or ``NAME (background lane)``."""
        return f"{self.name} ({self.lane} lane)" if self.lane else self.name


def host_listens(path: Path) -> bool:
    """Something listens at ``path``: a host that is alive, however slow it answers (a
    stale socket file refuses the connection)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    try:
        probe.connect(str(path))
        return True
    except BlockingIOError:
        return True  # its backlog is full: it listens
    except OSError:
        return False
    finally:
        probe.close()


async def wait_settled(clock: LoopClock, slots: list[DriverSlot], timeout: float) -> None:
    """Wait up to ``timeout`` until no host of ``slots`` is starting (each attached, or its
    attempt over); a detaching npud then leaves the attached ones running."""
    starting = [s for s in slots if not s.settled.is_set() and s.task is not None]
    if not starting:
        return
    names = ", ".join(s.name for s in starting)
    log.info("detaching: waiting up to %g s for driver %s to finish starting and attach",
             timeout, names)
    waits = {asyncio.ensure_future(s.settled.wait()) for s in starting}
    all_settled = asyncio.ensure_future(asyncio.wait(waits))
    try:
        await wait_first(clock, {all_settled}, timeout)
    finally:
        for t in [all_settled, *waits]:
            t.cancel()
    for s in starting:
        if not s.settled.is_set():
            log.warning("driver %s did not finish starting within %g s of npud's stop: "
                        "stopping it (it holds nothing)", s.name, timeout)


__all__ = ["Backoff", "DriverSlot", "host_listens", "wait_settled"]
