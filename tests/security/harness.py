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


class Lifecycle(ModelLoadRequestCallback):
    """Records a request's callbacks; reports loaded on CAN_LOAD_NOW."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.seen: list[str] = []
        self.listener: Any = None

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        with self.cond:
            self.listener = listener
            self.seen.append(LoadStatus(status).name)
            self.cond.notify_all()
        if status == LoadStatus.CAN_LOAD_NOW:
            listener.notify_model_loaded(request)

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


def wait_until(pred: Any, timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``pred`` until it is true (a state another process reaches), or fail."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
