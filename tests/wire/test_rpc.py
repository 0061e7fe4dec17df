"""The transport: calls, errors, pushes, fd passing, handshake and hostile frames."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from npumanager.errors import InvalidArgument, ProtocolError, ServiceUnavailable
from npumanager.proto.v1.wire_pb2 import Frame, Hello
from npumanager.wire.client import SyncRpcClient
from npumanager.wire.conn import CallContext
from npumanager.wire.framing import ERROR, REQUEST, WireFrame, encode, parse_frame
from npumanager.wire.server import RpcServer


def _echo(ctx: CallContext, payload: bytes) -> bytes:
    if payload == b"bad":
        raise InvalidArgument("bad payload")
    if payload == b"boom":
        raise RuntimeError("bug")
    if ctx.fds:
        data = os.read(ctx.fds[0], 100)
        for fd in ctx.fds:
            os.close(fd)
        return data
    ctx.conn.push("note", b"pushed:" + payload)
    return payload


async def _slow(ctx: CallContext, payload: bytes) -> bytes:
    await asyncio.sleep(0.001)
    return b"slow:" + payload


class _ServerThread:
    def __init__(self, path: str, **kw: object) -> None:
        self.path = path
        self.kw = kw
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_evt: asyncio.Event | None = None
        self.server: RpcServer | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(5)

    def _run(self) -> None:
        async def main() -> None:
            self.loop = asyncio.get_running_loop()
            self.stop_evt = asyncio.Event()
            self.server = RpcServer(self.path, "test", {"echo": _echo, "slow": _slow}, **self.kw)  # type: ignore[arg-type]
            await self.server.start()
            self.ready.set()
            await self.stop_evt.wait()
            await self.server.close("test over")

        asyncio.run(main())

    def stop(self) -> None:
        assert self.loop is not None and self.stop_evt is not None
        if not self.thread.is_alive():
            return
        self.loop.call_soon_threadsafe(self.stop_evt.set)
        self.thread.join(5)


@pytest.fixture
def server(runtime_dir: Path) -> Iterator[_ServerThread]:
    s = _ServerThread(str(runtime_dir / "t.sock"))
    yield s
    s.stop()


@pytest.mark.parametrize("threaded", [True, False])
def test_call_reply_error_push_and_fds(server: _ServerThread, threaded: bool) -> None:
    pushes: list[tuple[str, bytes]] = []
    with SyncRpcClient(server.path, "test", on_push=lambda m, p, f: pushes.append((m, p)),
                       threaded=threaded) as c:
        assert c.hello.uid == os.getuid()
        assert c.call("echo", b"hi")[0] == b"hi"
        assert c.call("slow", b"x")[0] == b"slow:x"
        with pytest.raises(InvalidArgument, match="bad payload"):
            c.call("echo", b"bad")
        from npumanager.errors import InternalError

        with pytest.raises(InternalError, match="RuntimeError: bug"):
            c.call("echo", b"boom")
        with pytest.raises(ProtocolError, match="unknown method"):
            c.call("nope")
        r, w = os.pipe()
        os.write(w, b"via fd")
        assert c.call("echo", b"", fds=[r])[0] == b"via fd"
        os.close(r)
        os.close(w)
        assert c.call("echo", b"still fine")[0] == b"still fine"
    if threaded:
        assert ("note", b"pushed:hi") in pushes


def _raw(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.settimeout(5)
    return s


def _read_frame(s: socket.socket) -> WireFrame:
    hdr = b""
    while len(hdr) < 4:
        chunk = s.recv(4 - len(hdr))
        assert chunk, "closed before a frame"
        hdr += chunk
    (n,) = struct.unpack(">I", hdr)
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    return parse_frame(body)


def test_call_before_hello_is_refused(server: _ServerThread) -> None:
    s = _raw(server.path)
    s.sendall(encode(Frame(kind=REQUEST, call_id=1, method="echo", payload=b"x")))
    f = _read_frame(s)
    s.close()
    assert f.error_type == "ProtocolError" and "before hello" in f.error_message


def test_wrong_protocol_version_is_refused(server: _ServerThread) -> None:
    s = _raw(server.path)
    hello = Hello(protocol_version=99, service="test").SerializeToString()
    s.sendall(encode(Frame(kind=REQUEST, call_id=1, method="hello", payload=hello)))
    f = _read_frame(s)
    s.close()
    assert f.error_type == "ProtocolError" and "version 99" in f.error_message


@pytest.mark.parametrize(
    "garbage",
    [
        struct.pack(">I", 1 << 30),  # announces a 1 GiB frame
        struct.pack(">I", 5) + b"\xff\xff\xff\xff\xff",  # not a protobuf
    ],
)
def test_hostile_frame_closes_only_that_connection(server: _ServerThread, garbage: bytes) -> None:
    good = SyncRpcClient(server.path, "test")
    s = _raw(server.path)
    s.sendall(garbage)
    f = _read_frame(s)
    assert f.kind == ERROR and f.error_type in ("ProtocolError", "FrameTooLarge")
    assert s.recv(10) == b""  # closed
    s.close()
    assert good.call("echo", b"alive")[0] == b"alive"
    good.close()


def test_connection_limit_per_uid(runtime_dir: Path) -> None:
    srv = _ServerThread(str(runtime_dir / "lim.sock"), max_connections_per_uid=2)
    try:
        a = SyncRpcClient(srv.path, "test")
        b = SyncRpcClient(srv.path, "test")
        from npumanager.errors import LimitExceeded

        with pytest.raises((LimitExceeded, ServiceUnavailable)):
            SyncRpcClient(srv.path, "test")
        a.close()
        b.close()
    finally:
        srv.stop()


def test_server_shutdown_fails_pending_and_later_calls(server: _ServerThread) -> None:
    c = SyncRpcClient(server.path, "test")
    server.stop()
    with pytest.raises(ServiceUnavailable):
        for _ in range(3):
            c.call("echo", b"x", timeout=5)
    c.close()


def test_no_daemon_is_service_unavailable(runtime_dir: Path) -> None:
    with pytest.raises(ServiceUnavailable, match="npu serve"):
        SyncRpcClient(str(runtime_dir / "absent.sock"), "manager")
