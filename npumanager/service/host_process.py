"""A driver host process npud spawned, watched with public APIs only, so that npud can
leave it running (a restart) without any event loop killing it.

asyncio's own subprocess transport kills a child that still runs when the transport is
closed, and its ``__del__`` closes it: keeping a host alive past npud's exit took
reaching into private attributes (``Process._transport._proc``), and uvloop's
transport is another class again. Here the host is a plain :class:`subprocess.Popen`;
its exit is watched through a pidfd (``os.pidfd_open``, Linux 5.3) registered with
``loop.add_reader``, or, where pidfds are refused (an old kernel, a seccomp filter), by
polling ``Popen.poll`` every ``POLL_S``; its stdout (the one ``ready`` line) is read
through ``loop.connect_read_pipe``. :meth:`HostProcess.disown` just stops watching:
nothing that is closed or collected afterwards signals the host.

The interface is the part of ``asyncio.subprocess.Process`` the supervisor uses
(``pid``, ``returncode``, ``stdout``, ``wait``, ``terminate``, ``kill``), with either
event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
from typing import Any

log = logging.getLogger("npumanager.service.supervisor")

#: How often a host's exit is polled where no pidfd can be had.
POLL_S = 0.1

#: The Popen of each host left running: collecting one that still runs warns
#: (ResourceWarning) that it does; it does, on purpose.
_LEFT_RUNNING: list[subprocess.Popen[bytes]] = []


class HostProcess:
    def __init__(self, popen: subprocess.Popen[bytes], loop: asyncio.AbstractEventLoop,
                 stdout: asyncio.StreamReader, pipe: asyncio.BaseTransport) -> None:
        self.popen = popen
        self.pid = popen.pid
        self.stdout = stdout
        self.returncode: int | None = None
        self._loop = loop
        self._pipe = pipe
        self._exited: asyncio.Future[int] = loop.create_future()
        self._pidfd = -1
        self._poll: asyncio.TimerHandle | None = None
        try:
            self._pidfd = os.pidfd_open(popen.pid)
        except (OSError, AttributeError) as exc:  # ENOSYS, EPERM (seccomp); not Linux
            log.debug("no pidfd for driver host %d (%s): polling its exit", popen.pid, exc)
        if self._pidfd >= 0:
            loop.add_reader(self._pidfd, self._check)
        else:
            self._poll = loop.call_later(POLL_S, self._check)

    @classmethod
    async def spawn(cls, argv: list[str], **kwargs: Any) -> HostProcess:
        """Start ``argv`` with its stdout piped to us and stdin from /dev/null
        (``kwargs``: further ``subprocess.Popen`` arguments)."""
        loop = asyncio.get_running_loop()
        popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                 **kwargs)
        assert popen.stdout is not None
        reader = asyncio.StreamReader()
        try:
            pipe, _ = await loop.connect_read_pipe(
                lambda: asyncio.StreamReaderProtocol(reader), popen.stdout)
        except BaseException:
            popen.kill()
            popen.wait()
            popen.stdout.close()
            raise
        return cls(popen, loop, reader, pipe)

    def _check(self) -> None:
        """The pidfd is readable (the host exited), or it is time to poll."""
        code = self.popen.poll()  # reaps it, without blocking
        if code is None:
            if self._pidfd < 0:
                self._poll = self._loop.call_later(POLL_S, self._check)
            return
        self._unwatch()
        self.returncode = code
        if not self._exited.done():
            self._exited.set_result(code)

    def _unwatch(self) -> None:
        if self._pidfd >= 0:
            self._loop.remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1
        if self._poll is not None:
            self._poll.cancel()
            self._poll = None

    async def wait(self) -> int:
        """The exit status (negative: the signal), once the host has exited."""
        return await asyncio.shield(self._exited)

    def send_signal(self, sig: int) -> None:
        """``sig`` to the host, unless it has exited (a pidfd cannot name another
        process that reused its pid)."""
        if self.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            if self._pidfd >= 0:
                signal.pidfd_send_signal(self._pidfd, sig)
            elif self.popen.poll() is None:
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def close_stdout(self) -> None:
        """Our end of its stdout: a reader waiting on it sees the end."""
        self._pipe.close()
        self.stdout.feed_eof()

    def disown(self) -> None:
        """Stop watching the host and let it outlive npud: nothing here signals it, now
        or when this object or its pipe is collected."""
        self._unwatch()
        self.close_stdout()
        if self.returncode is None:
            _LEFT_RUNNING.append(self.popen)
        if not self._exited.done():
            self._exited.cancel()


__all__ = ["POLL_S", "HostProcess"]
