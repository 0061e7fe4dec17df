"""What the apps in the security tests do, as functions run under other uids
(``npumanager.testing.procs``): a well-behaved app that must keep being served, and
the building blocks of the attacks (raw sockets that speak the wire by hand)."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from npumanager import (
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    NpuManager,
    RequestStatus,
)
from npumanager.proto.v1.wire_pb2 import Hello
from npumanager.testing import procs
from npumanager.wire.framing import PROTOCOL_VERSION, REQUEST, pack

#: The attacker and the bystander (no such users need to exist).
ATTACKER, BYSTANDER = 50001, 50002

#: Apps run under other uids (setuid in forked children): root only.
needs_root = pytest.mark.skipif(
    os.getuid() != 0, reason="runs apps under other uids (setuid in forked children): run "
    "the security tests as root")


class Lifecycle(ModelLoadRequestCallback):
    """Records a request's callbacks; reports loaded on CAN_LOAD_NOW."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.seen: list[str] = []
        self.listener: Any = None
        #: Set once notify_model_loaded has gone out on the connection.
        self.loaded_sent = threading.Event()

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        with self.cond:
            self.listener = listener
            self.seen.append(LoadStatus(status).name)
            self.cond.notify_all()
        if status == LoadStatus.CAN_LOAD_NOW:
            listener.notify_model_loaded(request)
            self.loaded_sent.set()

    def on_model_load_request_complete(self, request: Any, status: Any) -> None:
        with self.cond:
            self.seen.append(RequestStatus(status).name)
            self.cond.notify_all()

    def wait_for(self, what: str, timeout: float = 10.0) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: what in self.seen, timeout):
                raise TimeoutError(f"no {what} within {timeout} s (saw {self.seen})")


def served(runtime_dir: str | Path, request_id: int = 1) -> list[str]:
    """A whole request lifecycle: granted, loaded, unloaded, complete. Returns what the app
    saw (``["CAN_LOAD_NOW", "COMPLETE"]`` when served)."""
    with NpuManager(runtime_dir, client_name="bystander") as mgr:
        req = ModelLoadRequest(id=request_id)
        cb = Lifecycle()
        mgr.request_can_load_model(req, cb)
        cb.wait_for("CAN_LOAD_NOW")
        cb.listener.notify_model_unloaded(req)
        cb.wait_for("COMPLETE")
        return cb.seen


def assert_served(runtime_dir: str | Path, uid: int = BYSTANDER, request_id: int = 1) -> None:
    """Another user's app still gets a grant and completes its request."""
    seen = procs.run_as(uid, None, served, str(runtime_dir), request_id, timeout=30)
    assert seen == ["CAN_LOAD_NOW", "COMPLETE"], seen


def holding_app(runtime_dir: str | Path, request_ids: list[int]) -> dict[int, str]:
    """Holds granted, loaded requests until the test sends anything; returns the grant
    ids (so a test can check nobody else sees them)."""
    with NpuManager(runtime_dir, client_name="holder") as mgr:
        cbs = {}
        for rid in request_ids:
            cbs[rid] = Lifecycle()
            mgr.request_can_load_model(ModelLoadRequest(id=rid), cbs[rid])
        for cb in cbs.values():
            cb.wait_for("CAN_LOAD_NOW")
            assert cb.loaded_sent.wait(10)
        # A call on the same connection is handled after the notifications sent before it:
        # once it answers, npud has every request as loaded.
        mgr.dump()
        procs.announce("holding")
        procs.receive(timeout=None)
        return {rid: cb.listener.grant_id for rid, cb in cbs.items()}


def raw_connect(path: str | Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(path))
    return s


def hello_frame(service: str = "manager", call_id: int = 1) -> bytes:
    body = Hello(protocol_version=PROTOCOL_VERSION, service=service).SerializeToString()
    return pack(REQUEST, call_id, b"hello", body)


def read_until_closed(s: socket.socket, timeout: float) -> tuple[bytes, float]:
    """Everything the server sends until it closes the connection, and when it closed
    (seconds from now). TimeoutError if it is still open after ``timeout``."""
    t0 = time.monotonic()
    s.settimeout(timeout)
    got = b""
    while True:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            chunk = b""
        except TimeoutError:
            raise TimeoutError(f"still open after {timeout} s (got {got!r})") from None
        if not chunk:
            return got, time.monotonic() - t0
        got += chunk


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fd_count(pid: int) -> int:
    """Open fds of another process (the test is root)."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_for_fds_at_most(pid: int, most: int, timeout: float) -> int:
    """``pid``'s open fd count once it is at most ``most``, or the count after ``timeout``
    seconds. A peer that hangs up is taken by the other process's loop when that loop gets
    the CPU: its fds close some time after the peer is gone, not at once."""
    deadline = time.monotonic() + timeout
    while True:
        n = fd_count(pid)
        if n <= most or time.monotonic() > deadline:
            return n
        time.sleep(0.02)


def send_with_fds(s: socket.socket, data: bytes, fds: list[int]) -> None:
    """One sendmsg: ``data`` with ``fds`` attached (SCM_RIGHTS) to its first byte."""
    import array

    n = s.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    if n < len(data):
        s.sendall(data[n:])


def pipes_closed_by_peer(reads: list[int], timeout: float) -> bool:
    """True once every pipe in ``reads`` reports EOF: the only other holders of their write
    ends (which we sent, then closed here) have closed them."""
    import select

    deadline = time.monotonic() + timeout
    left = set(reads)
    while left:
        wait = deadline - time.monotonic()
        if wait <= 0:
            return False
        ready, _, _ = select.select(list(left), [], [], wait)
        for fd in ready:
            if os.read(fd, 1) == b"":
                left.discard(fd)
    return True


def driver_pid(runtime_dir: str | Path, name: str = "reference") -> int:
    """The pid of the driver host serving ``runtime_dir`` (found in /proc: test is root)."""
    want = f"npumanager driver {name} --runtime-dir {runtime_dir}"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if want in cmd:
            return int(entry)
    raise LookupError(f"no driver host for {runtime_dir}")


def device_served(runtime_dir: str | Path, request_id: int = 1) -> list[float]:
    """A real model on the driver: granted by npud, prepared, executed (y = x + 1),
    released. Returns the output row."""
    import numpy as np

    from npumanager import nn
    from npumanager.testing.onnx_models import add_model

    with NpuManager(runtime_dir, client_name="bystander") as mgr:
        req = ModelLoadRequest(id=request_id)
        cb = Lifecycle()
        mgr.request_can_load_model(req, cb)
        cb.wait_for("CAN_LOAD_NOW")
        dev = nn.device("reference", runtime_dir)
        try:
            model = dev.prepare_model(add_model(), grant=cb.listener)
            y = model.execute({"x": np.arange(4, dtype=np.float32).reshape(1, 4)})["y"]
            model.release()
        finally:
            dev.close()
        cb.listener.notify_model_unloaded(req)
        cb.wait_for("COMPLETE")
        return [float(v) for v in y.ravel()]


def assert_device_served(runtime_dir: str | Path, uid: int = BYSTANDER) -> None:
    out = procs.run_as(uid, None, device_served, str(runtime_dir), timeout=60)
    assert out == [1.0, 2.0, 3.0, 4.0], out


def read_frame(s: socket.socket, timeout: float = 10.0) -> tuple[int, int, str, bytes, int]:
    """The next frame from a raw socket (kind, call_id, name, payload, n_fds)."""
    from npumanager.wire.framing import FrameDecoder

    dec = FrameDecoder(1 << 20)
    s.settimeout(timeout)
    while True:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed before a whole frame arrived")
        frames = dec.frames(chunk)
        if frames:
            return frames[0]


def said_hello(path: str | Path, service: str = "manager") -> socket.socket:
    """A raw connection past the handshake."""
    s = raw_connect(path)
    s.sendall(hello_frame(service))
    kind, _cid, name, payload, _n = read_frame(s)
    assert kind == 2, (name, payload)  # REPLY
    return s
