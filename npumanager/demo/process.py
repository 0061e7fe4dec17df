"""App processes for the demo: fork (after imports), become the app's uid, run its main.

Each app is a forked child of the demo: it drops to its own uid/gid when the
demo runs as root (npud tells apps apart by their kernel-verified uid, so
preemption between apps needs distinct uids), asks the kernel to kill it if
the demo dies, and talks to the demo over two pipes of JSON lines: events
out (what it saw and measured), commands in. Its stdout goes to /dev/null and
its stderr to a log file, so nothing it prints garbles the demo's output.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from npumanager.demo import diag

_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the demo (its parent) exits, however it exits. A demo
    that exited before this ran (a Ctrl-C while this app was still starting, on a loaded
    machine) sends nothing: this process was reparented then, and exits now."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


_STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def signals_held() -> Any:
    """Hold Ctrl-C and SIGTERM (pending, not lost) while an app is forked and recorded.

    The demo stops on Ctrl-C by raising KeyboardInterrupt and stopping every app it has
    recorded. A Ctrl-C that landed between ``fork()`` and the caller recording the child
    left an app nobody stopped (seen under load: "demo apps still running"). Held here,
    the signal is taken right after the ``with`` block, when the app is on the list.

    Masking the signals in this thread is not enough: the kernel then delivers them to
    another thread of the demo (an app's event reader), and Python runs the handler in
    the main thread at its next check, inside this block (seen beside a busy loop: an
    app left running after a Ctrl-C). So the handlers are replaced too, by one that
    notes the signal; it is raised again once the block is over.
    """
    pending: list[int] = []
    old_handlers: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in _STOP_SIGNALS:
            old_handlers[sig] = signal.signal(sig, lambda n, _f: pending.append(n))
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        for held, handler in old_handlers.items():
            signal.signal(held, handler)
        for n in dict.fromkeys(pending):
            signal.raise_signal(n)


class Outbox:
    """The child's end of the event pipe: one JSON object per line, one write each."""

    def __init__(self, fd: int, app: str) -> None:
        self.fd = fd
        self.app = app

    def emit(self, ev: str, **fields: Any) -> None:
        line = json.dumps({"app": self.app, "t": time.monotonic(), "ev": ev, **fields}) + "\n"
        data = line.encode()
        # Lines stay under PIPE_BUF (4096), so each write is atomic.
        with contextlib.suppress(OSError):
            os.write(self.fd, data)


class LineReader:
    """Reads JSON lines from a pipe on a thread and hands each object to ``on_item``."""

    def __init__(self, fd: int, on_item: Callable[[dict[str, Any]], None], name: str,
                 on_eof: Callable[[], None] | None = None) -> None:
        self.fd = fd
        self.on_item = on_item
        self.on_eof = on_eof
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                if raw.strip():
                    try:
                        item = json.loads(raw)
                    except ValueError:
                        continue
                    self.on_item(item)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        if self.on_eof is not None:
            self.on_eof()


class AppProcess:
    """A forked app. ``main(outbox, commands)`` runs in the child as ``uid`` (if given)."""

    def __init__(
        self,
        name: str,
        uid: int | None,
        main: Callable[[Outbox, LineQueue], None],
        on_event: Callable[[dict[str, Any]], None],
        log_path: str,
    ) -> None:
        self.name = name
        self.uid = uid
        ev_r, ev_w = os.pipe()
        cmd_r, cmd_w = os.pipe()
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the app
            code = 0
            try:
                os.close(ev_r)
                os.close(cmd_w)
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # the demo ends us on Ctrl-C
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                # The parent may fork inside signals_held(): the mask is inherited.
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
                diag.in_app()
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)
                os.dup2(log_fd, 2)
                if uid is not None and os.getuid() == 0:
                    os.setgroups([])
                    os.setgid(uid)
                    os.setuid(uid)
                _die_with_parent(parent)  # after setuid: a credential change clears it
                main(Outbox(ev_w, name), LineQueue(cmd_r))
            except BaseException:
                code = 1
                with contextlib.suppress(BaseException):
                    import traceback

                    traceback.print_exc()
            finally:
                os._exit(code)
        os.close(ev_w)
        os.close(cmd_r)
        os.close(log_fd)
        self.pid = pid
        self._cmd_fd: int | None = cmd_w
        self._status: int | None = None
        self._reader = LineReader(ev_r, on_event, f"demo-{name}-events")

    def __repr__(self) -> str:
        return f"<AppProcess {self.name} pid={self.pid} uid={self.uid}>"

    def send(self, cmd: str, **fields: Any) -> None:
        if self._cmd_fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(self._cmd_fd, (json.dumps({"cmd": cmd, **fields}) + "\n").encode())

    def poll(self) -> bool:
        """True once the child has exited (and is reaped)."""
        if self._status is not None:
            return True
        pid, status = os.waitpid(self.pid, os.WNOHANG)
        if pid == 0:
            return False
        self._status = status
        return True

    def stop(self, timeout: float = 3.0) -> None:
        """Ask the app to stop (it releases and reports), then make sure it is gone."""
        self.send("stop")
        deadline = time.monotonic() + timeout
        while not self.poll() and time.monotonic() < deadline:
            time.sleep(0.02)
        self.kill()

    def kill(self) -> None:
        if not self.poll():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self._status = -9
        if self._cmd_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._cmd_fd)
            self._cmd_fd = None
        self._reader.thread.join(1.0)


def stop_all(procs: list[AppProcess], timeout: float) -> None:
    """Ask every app to stop at once, give them ``timeout`` seconds together, then SIGKILL
    those still running, all at once. One after the other with a wait each (as before),
    four apps blocked in a prepare took 4 x 3 s: an app reads its ``stop`` only between
    calls, and a prepare under load takes seconds (2.7 s for the demo's LLM beside twelve
    busy loops)."""
    for proc in procs:
        proc.send("stop")
    deadline = time.monotonic() + timeout
    while not all(proc.poll() for proc in procs) and time.monotonic() < deadline:
        time.sleep(0.02)
    for proc in procs:
        if not proc.poll():
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
    for proc in procs:
        proc.kill()  # reaps; closes its command pipe and joins its reader


class LineQueue:
    """The child's end of the command pipe, read on a thread into ``put`` callbacks."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def start(self, on_item: Callable[[dict[str, Any]], None]) -> None:
        """Deliver each command to ``on_item``; the demo going away arrives as ``stop``."""
        LineReader(self.fd, on_item, "app-commands", on_eof=lambda: on_item({"cmd": "stop"}))
