"""systemd's notify protocol (sd_notify(3)), with the standard library only.

Under ``Type=notify`` systemd passes ``NOTIFY_SOCKET``: a path, or an abstract
socket name starting with ``@``. Each message is one datagram of
newline-separated ``KEY=VALUE`` lines: ``READY=1`` once clients can connect,
``STATUS=...`` for `systemctl status`, ``STOPPING=1`` when shutting down,
``WATCHDOG=1`` as a keep-alive when ``WATCHDOG_USEC`` is set. Without
``NOTIFY_SOCKET`` every call is a no-op, so `npu serve` behaves the same
outside systemd. Sending never raises: a notify failure must not take npud down.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING

from npumanager.service.observe import DaemonObserver

if TYPE_CHECKING:
    from npumanager.service.daemon import Daemon

log = logging.getLogger("npumanager.npud")


def socket_address(value: str) -> str | None:
    """The AF_UNIX address for a ``NOTIFY_SOCKET`` value (``@name`` = abstract)."""
    if not value:
        return None
    if value.startswith("@"):
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    return None  # vsock and other forms are not for a local service


class Notifier:
    """Sends sd_notify messages when systemd asked for them (else does nothing)."""

    def __init__(self, environ: MutableMapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self.address = socket_address(env.get("NOTIFY_SOCKET", ""))
        self.watchdog_s: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_s = int(usec) / 1e6
        # The driver hosts npud starts must not talk to systemd as if they were npud.
        for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            env.pop(key, None)
        self._sock: socket.socket | None = None
        if self.address is not None:
            try:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            except OSError as exc:
                log.warning("systemd notify socket unusable: %s", exc)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, fields: Mapping[str, str]) -> bool:
        """One datagram with ``fields`` as KEY=VALUE lines; True when it was sent."""
        if self._sock is None or self.address is None:
            return False
        text = "\n".join(f"{k}={_one_line(v)}" for k, v in fields.items())
        try:
            self._sock.sendto(text.encode(), self.address)
            return True
        except OSError as exc:
            log.warning("systemd notify failed: %s", exc)
            return False

    def ready(self, status: str) -> bool:
        return self.send({"READY": "1", "STATUS": status,
                          "MAINPID": str(os.getpid())})

    def status(self, status: str) -> bool:
        return self.send({"STATUS": status})

    def stopping(self, status: str = "stopping") -> bool:
        return self.send({"STOPPING": "1", "STATUS": status})

    def watchdog(self) -> bool:
        return self.send({"WATCHDOG": "1"})

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _one_line(value: str) -> str:
    return str(value).replace("\n", " ")


class SystemdObserver(DaemonObserver):
    """npud's life as systemd sees it: READY=1 once clients can connect, STATUS= as drivers
    come and go, STOPPING=1, and WATCHDOG=1 from npud's loop (a hung loop stops pinging)."""

    def __init__(self, notifier: Notifier, describe: Callable[[Daemon], str]) -> None:
        self.n = notifier
        self.describe = describe
        self.daemon: Daemon | None = None
        self._ping: asyncio.TimerHandle | None = None

    def attach(self, daemon: Daemon) -> None:
        self.daemon = daemon
        if self.n.enabled and self.n.watchdog_s:
            self._keepalive()

    def _keepalive(self) -> None:
        assert self.n.watchdog_s is not None
        self.n.watchdog()
        self._ping = asyncio.get_running_loop().call_later(self.n.watchdog_s / 2,
                                                           self._keepalive)

    def on_ready(self, daemon: Daemon) -> None:
        self.n.ready(self.describe(daemon))

    def on_driver(self, name: str, up: bool, reason: str) -> None:
        if self.daemon is not None:
            self.n.status(self.describe(self.daemon))

    def on_stopping(self, reason: str) -> None:
        if self._ping is not None:
            self._ping.cancel()
        self.n.stopping(reason)

    def close(self) -> None:
        self.n.close()
