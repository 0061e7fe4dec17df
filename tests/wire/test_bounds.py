"""The transport's bounds: fds in flight, the hello deadline, accept back-off, and the
clients' timeouts (connect, hello, every call) that end in ServiceUnavailable."""

from __future__ import annotations

import array
import asyncio
import logging
import os
import resource
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from npumanager.errors import LimitExceeded, ServiceUnavailable
from npumanager.proto.v1.wire_pb2 import Hello
from npumanager.testing import procs
from npumanager.wire import client as wire_client
from npumanager.wire.client import SyncRpcClient, connect_async, default_call_timeout
from npumanager.wire.conn import CallContext, HandlerResult
from npumanager.wire.framing import (
    MAX_FDS,
    PROTOCOL_VERSION,
    REQUEST,
    FrameDecoder,
    pack,
)
from npumanager.wire.server import RpcServer

Body = Callable[[str, RpcServer], Awaitable[None]]


def _serve(runtime_dir: Path, body: Body, **server_kw: Any) -> None:
    async def main() -> None:
        async def never(ctx: CallContext, payload: bytes) -> HandlerResult:
            await asyncio.Event().wait()
            return None

        def takes_fds(ctx: CallContext, payload: bytes) -> HandlerResult:
            n = len(ctx.fds)
            for fd in ctx.fds:
                os.close(fd)
            return str(n).encode()

        def echo(ctx: CallContext, payload: bytes) -> HandlerResult:
            return payload

        path = str(runtime_dir / "b.sock")
        srv = RpcServer(path, "t", {"never": never, "fds": takes_fds, "echo": echo},
                        **server_kw)
        await srv.start()
        try:
            await body(path, srv)
        finally:
            await srv.close("done")

    asyncio.run(main())


def _hello(call_id: int = 1) -> bytes:
    return pack(REQUEST, call_id, b"hello",
                Hello(protocol_version=PROTOCOL_VERSION, service="t").SerializeToString())


def _pipes(n: int) -> tuple[list[int], list[int]]:
    pairs = [os.pipe() for _ in range(n)]
    return [r for r, _ in pairs], [w for _, w in pairs]


def _send_fds(s: socket.socket, data: bytes, fds: list[int]) -> None:
    s.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    for fd in fds:
        os.close(fd)


async def _all_eof(reads: list[int], timeout: float = 5.0) -> bool:
    """Every pipe's write end (we sent it, then closed ours) was closed by the server:
    woken by the loop when a pipe turns readable, no polling."""
    loop = asyncio.get_running_loop()
    left = set(reads)
    done = asyncio.Event()

    def readable(fd: int) -> None:
        if os.read(fd, 1) == b"":
            loop.remove_reader(fd)
            os.close(fd)
            left.discard(fd)
            if not left:
                done.set()

    if not left:
        return True
    for fd in reads:
        loop.add_reader(fd, readable, fd)
    try:
        await asyncio.wait_for(done.wait(), timeout)
    except TimeoutError:
        pass
    finally:
        for fd in left:
            loop.remove_reader(fd)
    return not left


async def _closed_with(s: socket.socket, timeout: float = 5.0) -> bytes:
    """What the server said before closing ``s`` (non-blocking reads on the loop)."""
    loop = asyncio.get_running_loop()
    s.setblocking(False)
    got = b""
    while True:
        try:
            chunk = await asyncio.wait_for(loop.sock_recv(s, 65536), timeout)
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            s.close()
            return got
        got += chunk


def test_pending_fds_of_the_buffered_frame() -> None:
    dec = FrameDecoder()
    assert dec.pending_fds() == 0
    frame = pack(REQUEST, 7, b"m", b"payload", 3)
    assert dec.frames(frame[:5]) == [] and dec.pending_fds() == MAX_FDS  # header incomplete
    assert dec.frames(frame[5:18]) == [] and dec.pending_fds() == 3
    assert dec.frames(frame[18:])[0][4] == 3 and dec.pending_fds() == 0
    # A header announcing more than a frame can carry does not widen the bound (fuzzing).
    assert dec.frames(pack(REQUEST, 7, b"m", b"payload", 255)[:20]) == []
    assert dec.pending_fds() == MAX_FDS


@pytest.mark.parametrize("n", [1, 40])
def test_fds_no_frame_announced_close_the_connection_and_every_fd(runtime_dir: Path,
                                                                   n: int) -> None:
    async def body(path: str, srv: RpcServer) -> None:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        s.sendall(_hello())
        reads, writes = _pipes(n)
        _send_fds(s, pack(REQUEST, 2, b"echo", b"x"), writes)  # announces none
        said = await _closed_with(s)
        assert b"ProtocolError" in said and b"no frame announced" in said
        assert await _all_eof(reads)
        assert not srv.connections and srv._fd_budgets == {}

    _serve(runtime_dir, body)


def test_announced_fds_reach_the_handler_and_the_connection_lives(runtime_dir: Path) -> None:
    async def body(path: str, srv: RpcServer) -> None:
        conn, _ = await connect_async(path, "t")
        reads, writes = _pipes(MAX_FDS)  # one whole frame's worth
        assert (await conn.call("fds", b"", fds=writes))[0] == str(MAX_FDS).encode()
        for fd in writes:
            os.close(fd)
        assert await _all_eof(reads)
        assert (await conn.call("echo", b"still"))[0] == b"still"
        conn.close()

    _serve(runtime_dir, body)


def test_fds_to_a_method_that_takes_none_close_the_connection(runtime_dir: Path) -> None:
    async def body(path: str, srv: RpcServer) -> None:
        conn, _ = await connect_async(path, "t")
        reads, writes = _pipes(2)
        assert (await conn.call("fds", b"", fds=writes[:1]))[0] == b"1"
        with pytest.raises(ServiceUnavailable, match="'echo' takes no fds"):
            await conn.call("echo", b"x", fds=writes[1:])
        for fd in writes:
            os.close(fd)
        assert await _all_eof(reads)

    _serve(runtime_dir, body, fd_methods=frozenset({"fds"}))


def test_fds_in_flight_are_bounded_per_connection_and_per_uid(runtime_dir: Path) -> None:
    async def body(path: str, srv: RpcServer) -> None:
        socks = []
        for _ in range(3):
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            s.sendall(_hello())
            socks.append(s)
        reads, writes = _pipes(4)
        _send_fds(socks[0], b"\0", writes[:3])  # a header begun: may announce them
        _send_fds(socks[0], b"\0", writes[3:])  # 4 > 3 in flight on one connection
        said = await _closed_with(socks[0])
        assert b"4 fds received: at most 3 may wait for their frame" in said
        assert await _all_eof(reads)
        reads, writes = _pipes(5)
        _send_fds(socks[1], b"\0", writes[:3])
        _send_fds(socks[2], b"\0", writes[3:])  # 5 > 4 for the uid over two connections
        said = await _closed_with(socks[2])
        assert b"has 5 fds waiting for their frames; the bound is 4" in said
        socks[1].close()
        assert await _all_eof(reads)

    _serve(runtime_dir, body, max_fds_in_flight=3, max_fds_in_flight_per_uid=4)


def test_a_service_that_takes_no_fds_closes_at_the_first(runtime_dir: Path) -> None:
    async def body(path: str, srv: RpcServer) -> None:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        reads, writes = _pipes(1)
        _send_fds(s, _hello(), writes)  # even with the hello
        said = await _closed_with(s)
        assert b"1 fds received: this service takes no fds" in said
        assert await _all_eof(reads)

    _serve(runtime_dir, body, max_fds_in_flight=0)


def test_a_connection_without_hello_is_closed_at_the_deadline(runtime_dir: Path) -> None:
    async def body(path: str, srv: RpcServer) -> None:
        silent = socket.socket(socket.AF_UNIX)
        silent.connect(path)
        talker = socket.socket(socket.AF_UNIX)
        talker.connect(path)
        talker.sendall(_hello())
        t0 = time.monotonic()
        said = await _closed_with(silent)
        assert time.monotonic() - t0 >= 0.15
        assert b"no hello within 0.2 s" in said
        assert len(srv.connections) == 1  # the one that said hello stays
        talker.close()

    _serve(runtime_dir, body, hello_timeout=0.2)


def _mute_listener(path: str) -> socket.socket:
    """Accepts nothing: connect() succeeds (the backlog), no hello is ever answered."""
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)
    s.listen(8)
    return s


@pytest.mark.parametrize("threaded", [True, False])
def test_sync_hello_waits_at_most_hello_timeout(runtime_dir: Path, threaded: bool) -> None:
    lst = _mute_listener(str(runtime_dir / "mute.sock"))
    t0 = time.monotonic()
    with pytest.raises(ServiceUnavailable, match=r"did not answer hello within 0\.3 s"):
        SyncRpcClient(str(runtime_dir / "mute.sock"), "manager", threaded=threaded,
                      hello_timeout=0.3)
    assert 0.25 <= time.monotonic() - t0 < 3
    lst.close()


def test_async_hello_waits_at_most_hello_timeout(runtime_dir: Path) -> None:
    lst = _mute_listener(str(runtime_dir / "mute.sock"))

    async def main() -> None:
        with pytest.raises(ServiceUnavailable, match=r"did not answer hello within 0\.3 s"):
            await connect_async(str(runtime_dir / "mute.sock"), "manager", hello_timeout=0.3)

    asyncio.run(main())
    lst.close()


@pytest.mark.parametrize("threaded", [True, False])
def test_a_sync_call_without_reply_ends_in_service_unavailable(runtime_dir: Path,
                                                              threaded: bool) -> None:
    async def body(path: str, srv: RpcServer) -> None:
        def client() -> str:
            c = SyncRpcClient(path, "t", threaded=threaded, call_timeout=0.3)
            assert c.call("echo", b"x")[0] == b"x"
            t0 = time.monotonic()
            try:
                c.call("never")
            except ServiceUnavailable as exc:
                took = time.monotonic() - t0
                assert 0.25 <= took < 3, took
                assert c.closed
                return str(exc)
            finally:
                c.close()
            return "answered?"

        msg = await asyncio.get_running_loop().run_in_executor(None, client)
        assert "did not answer never within 0.3 s; connection closed" in msg

    _serve(runtime_dir, body)


def test_an_async_call_without_reply_ends_in_service_unavailable(runtime_dir: Path) -> None:
    async def body(path: str, srv: RpcServer) -> None:
        conn, _ = await connect_async(path, "t", call_timeout=0.2)
        assert (await conn.call("echo", b"x"))[0] == b"x"
        t0 = time.monotonic()
        with pytest.raises(ServiceUnavailable, match=r"no reply within 0\.2 s"):
            await conn.call("never")
        assert 0.15 <= time.monotonic() - t0 < 2  # within one to two periods
        assert conn.closed

    _serve(runtime_dir, body)


def test_call_timeout_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NPU_CALL_TIMEOUT_S", raising=False)
    assert default_call_timeout("manager") == 30.0
    assert default_call_timeout("driver") == wire_client.DRIVER_CALL_TIMEOUT_S == 300.0
    monkeypatch.setenv("NPU_CALL_TIMEOUT_S", "2.5")
    assert default_call_timeout("manager") == default_call_timeout("driver") == 2.5
    monkeypatch.setenv("NPU_CALL_TIMEOUT_S", "soon")
    assert default_call_timeout("manager") == 30.0


def test_a_refused_connection_gets_a_typed_limit_exceeded(runtime_dir: Path) -> None:
    async def body(path: str, srv: RpcServer) -> None:
        held, _ = await connect_async(path, "t")
        for _ in range(10):
            with pytest.raises(LimitExceeded, match="already has 1 connections"):
                await connect_async(path, "t")

        def sync() -> list[str]:
            out = []
            for threaded in (True, False) * 5:
                try:
                    SyncRpcClient(path, "t", threaded=threaded).close()
                except LimitExceeded as exc:
                    out.append(type(exc).__name__)
            return out

        assert await asyncio.get_running_loop().run_in_executor(None, sync) == \
            ["LimitExceeded"] * 10
        held.close()

    _serve(runtime_dir, body, max_connections_per_uid=1)


def _starve_accept(path: str) -> dict[str, Any]:
    """In a forked child: a server whose accept() fails with EMFILE for ~1.5 s."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logging.getLogger("npumanager.wire.server").addHandler(Keep())

    async def main() -> dict[str, Any]:
        all_in = asyncio.Event()
        srv = RpcServer(path, "t", {}, on_connect=lambda conn: len(srv.connections) >= 8
                        and all_in.set())
        await srv.start()
        clients = []
        for _ in range(8):
            c = socket.socket(socket.AF_UNIX)
            c.connect(path)  # queued in the backlog
            c.sendall(_hello())
            clients.append(c)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 1, hard))
        await asyncio.sleep(1.5)
        starved = srv.accept_failures
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        await asyncio.wait_for(all_in.wait(), 30)  # every queued client gets in
        for c in clients:
            c.close()
        await srv.close()
        return {"failures": starved,
                "lines": [r.getMessage() for r in records if "accept" in r.getMessage()]}

    return asyncio.run(main())


def test_accept_out_of_fds_backs_off_and_logs_once(runtime_dir: Path) -> None:
    out = procs.run_as(None, None, _starve_accept, str(runtime_dir / "emfile.sock"))
    assert 3 <= out["failures"] <= 30, out  # backing off, not a hot loop (~150 at 10 ms)
    lines = out["lines"]
    assert len(lines) == 2, lines
    assert "accept failed" in lines[0] and "Too many open files" in lines[0]
    assert "accepting again after" in lines[1]

