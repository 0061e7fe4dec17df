"""Run a function as another uid/gid in a forked child (no exec), for multi-uid tests.

The child is a fork of the test process, so everything it imported is there;
it drops its groups, then sets gid and uid, runs the function and sends the
result (or the exception) back over a pipe, then ``os._exit``\\ s without
running the parent's atexit hooks or finalizers. Needs root in the parent.

``spawn_as`` returns a handle for long-lived "apps": the test can ``send`` it
messages that the child reads with :func:`receive`, wait for what the child
reports with :func:`announce` (``Child.expect``: the test waits on the event
itself, never polls), and collect its result with ``wait``. A child that runs
past its timeout is killed and the wait raises ``TimeoutError``: never a hang.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

_HDR = struct.Struct(">I")

# Set in the child: the read end of the parent -> child message pipe, and the write end of
# the child -> parent one (announcements, then the result; one writer at a time).
_inbox_fd: int | None = None
_outbox_fd: int | None = None
_outbox_lock = threading.Lock()


_EVENT: Any = object()  # _next_msg: "an announcement arrived"


class ChildFailed(Exception):
    """The child raised something that could not be sent back as itself."""


def _write_msg(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj)
    view = memoryview(_HDR.pack(len(data)) + data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_exact(fd: int, n: int, deadline: float | None) -> bytes | None:
    buf = b""
    while len(buf) < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no message from the other side in time")
            r, _, _ = select.select([fd], [], [], left)
            if not r:
                continue
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _read_msg(fd: int, deadline: float | None) -> tuple[bool, Any]:
    # The deadline applies to the wait for a message to start: once its first byte is
    # here the rest follows, and giving up halfway would desynchronize the stream.
    if deadline is not None:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no message from the other side in time")
            r, _, _ = select.select([fd], [], [], left)
            if r:
                break
    hdr = _read_exact(fd, _HDR.size, None)
    if hdr is None:
        return False, None
    (n,) = _HDR.unpack(hdr)
    body = _read_exact(fd, n, None)
    if body is None:
        return False, None
    return True, pickle.loads(body)


def receive(timeout: float | None = 10.0) -> Any:
    """In a child started by :func:`spawn_as`: the next message the test sent."""
    if _inbox_fd is None:
        raise RuntimeError("receive() works only inside a spawn_as child")
    ok, obj = _read_msg(_inbox_fd, None if timeout is None else time.monotonic() + timeout)
    if not ok:
        raise EOFError("the test closed the channel")
    return obj


def announce(event: Any) -> None:
    """In a child started by :func:`spawn_as`: tell the test that ``event`` happened
    (``Child.expect`` waits for it). Any thread of the child may announce."""
    if _outbox_fd is None:
        raise RuntimeError("announce() works only inside a spawn_as child")
    with _outbox_lock:
        _write_msg(_outbox_fd, ("event", event))


class Child:
    """A forked child running a function as another uid."""

    def __init__(self, pid: int, result_fd: int, inbox_fd: int, timeout: float) -> None:
        self.pid = pid
        self._result_fd = result_fd
        self._inbox_fd: int | None = inbox_fd
        self._deadline = time.monotonic() + timeout
        self._done = False
        self.exit_status: int | None = None
        #: What the child announced so far, in order.
        self.events: list[Any] = []
        self._seen = 0  # events already matched by expect()
        self._result: tuple[bool, Any] | None = None  # read while expecting an event

    def _next_msg(self, deadline: float) -> tuple[bool, Any]:
        """The next message that is not an announcement (those go to ``events``)."""
        while True:
            ok, obj = _read_msg(self._result_fd, deadline)
            if ok and isinstance(obj, tuple) and len(obj) == 2 and obj[0] == "event":
                self.events.append(obj[1])
                return True, _EVENT
            return ok, obj

    def expect(self, event: Any, timeout: float = 30.0) -> Any:
        """Wait until the child announces ``event`` (or, if callable, an event it accepts)
        after the ones matched before; returns it. Fails at once if the child finished.
        The default bound is generous: what a child announces usually follows round trips
        to npud or a driver host, which a machine kept busy by a test suite slows many
        times; it costs nothing while the event comes."""
        match = event if callable(event) else (lambda e: e == event)
        deadline = time.monotonic() + timeout
        while True:
            for i in range(self._seen, len(self.events)):
                if match(self.events[i]):
                    self._seen = i + 1
                    return self.events[i]
            if self._result is not None:
                raise AssertionError(f"child {self.pid} finished without announcing {event!r}; "
                                     f"it announced {self.events}")
            try:
                ok, obj = self._next_msg(deadline)
            except TimeoutError:
                raise AssertionError(f"child {self.pid} did not announce {event!r} within "
                                     f"{timeout} s; it announced {self.events}") from None
            if obj is not _EVENT:
                self._result = (ok, obj)

    def __repr__(self) -> str:
        return f"<Child pid={self.pid} {'done' if self._done else 'running'}>"

    def send(self, obj: Any) -> None:
        if self._inbox_fd is None:
            raise RuntimeError("channel closed")
        _write_msg(self._inbox_fd, obj)

    def wait(self, timeout: float | None = None,
             on_timeout: Callable[[], object] | None = None) -> Any:
        """The function's return value, or its exception re-raised here. ``on_timeout``
        runs before a child that did not finish in time is killed (to ask it, and the
        processes it talks to, for their stacks: see :func:`dump_stacks_on_usr1`)."""
        deadline = self._deadline if timeout is None else time.monotonic() + timeout
        ok, obj = self._result if self._result is not None else (True, _EVENT)
        try:
            while obj is _EVENT:
                ok, obj = self._next_msg(deadline)
        except TimeoutError:
            if on_timeout is not None:
                on_timeout()
            self.kill()
            raise TimeoutError(f"child {self.pid} did not finish in time") from None
        finally:
            self._close()
        if not ok:
            raise ChildFailed(f"child {self.pid} died without a result "
                              f"(exit status {self.exit_status})")
        kind, value = obj
        if kind == "ok":
            return value
        raise value

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if not self._done:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass
        self._close()

    def _close(self) -> None:
        if self._done:
            return
        self._done = True
        for fd in (self._result_fd, self._inbox_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._inbox_fd = None
        _, status = os.waitpid(self.pid, 0)
        self.exit_status = status

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def dump_stacks_on_usr1() -> None:
    """In a child: ``kill -USR1`` writes every thread's stack to stderr (the test's, which
    pytest shows with a failure) and the child carries on."""
    import faulthandler

    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)


def spawn_as(uid: int | None, gid: int | None, fn: Callable[..., Any], *args: Any,
             timeout: float = 30.0, **kwargs: Any) -> Child:
    """Fork, become ``uid``/``gid`` (default gid = uid), run ``fn(*args, **kwargs)``.

    ``uid=None`` keeps the parent's identity (a plain forked worker)."""
    gid = uid if gid is None else gid
    res_r, res_w = os.pipe()
    in_r, in_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child
        code = 0
        try:
            os.close(res_r)
            os.close(in_w)
            global _inbox_fd, _outbox_fd
            _inbox_fd, _outbox_fd = in_r, res_w
            # Leave the parent's signal dispositions (pytest, asyncio) behind.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            if uid is not None and gid is not None:
                os.setgroups([])
                os.setgid(gid)
                os.setuid(uid)
            try:
                value = fn(*args, **kwargs)
                msg: tuple[str, Any] = ("ok", value)
            except BaseException as exc:
                msg = ("err", exc)
            try:
                pickle.dumps(msg)
            except Exception:
                detail = "".join(traceback.format_exception(msg[1])) if msg[0] == "err" else ""
                msg = ("err", ChildFailed(f"result not picklable: {msg[1]!r}\n{detail}"))
            with _outbox_lock:
                _write_msg(res_w, msg)
        except BaseException:
            code = 1
            try:
                traceback.print_exc()
            except BaseException:
                pass
        finally:
            os._exit(code)
    os.close(res_w)
    os.close(in_r)
    return Child(pid, res_r, in_w, timeout)


def run_as(uid: int | None, gid: int | None, fn: Callable[..., Any], *args: Any,
           timeout: float = 30.0, **kwargs: Any) -> Any:
    """Run ``fn`` as ``uid``/``gid`` in a forked child and return its result."""
    return spawn_as(uid, gid, fn, *args, timeout=timeout, **kwargs).wait()
