"""The asyncio connection end to end: ordering, batching, big frames, fds, gate, closing."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from npumanager.errors import InvalidArgument, ProtocolError, ServiceUnavailable
from npumanager.wire.client import connect_async
from npumanager.wire.conn import CallContext, HandlerResult, RpcConnection
from npumanager.wire.framing import PUSH, REQUEST, WireFrame, encode, parse_frame
from npumanager.wire.server import RpcServer

Body = Callable[[str, RpcServer], Awaitable[None]]


def _run(runtime_dir: Path, body: Body, **server_kw: object) -> None:
    sent: list[int] = []  # fds given away by give_fd, closed at the end

    async def main() -> None:
        seen: list[bytes] = []

        def echo(ctx: CallContext, payload: bytes) -> HandlerResult:
            if payload == b"bad":
                raise InvalidArgument("bad")
            seen.append(payload)
            ctx.conn.push("note", payload)
            return payload

        def fds(ctx: CallContext, payload: bytes) -> HandlerResult:
            got = [os.read(fd, 100) for fd in ctx.fds]
            for fd in ctx.fds:
                os.close(fd)
            return b"|".join(got)

        def give_fd(ctx: CallContext, payload: bytes) -> HandlerResult:
            r, w = os.pipe()
            os.write(w, payload)
            os.close(w)
            sent.append(r)
            return b"", [r]

        def empty(ctx: CallContext, payload: bytes) -> HandlerResult:
            return None

        path = str(runtime_dir / "a.sock")
        srv = RpcServer(path, "t", {"echo": echo, "fds": fds, "give_fd": give_fd,
                                    "empty": empty}, **server_kw)  # type: ignore[arg-type]
        await srv.start()
        try:
            await body(path, srv)
        finally:
            for fd in sent:
                os.close(fd)
            await srv.close("done")

    asyncio.run(main())


def test_many_pipelined_calls_answer_in_order_with_pushes_first(runtime_dir: Path) -> None:
    async def body(path: str, srv: RpcServer) -> None:
        notes: list[bytes] = []

        def note(ctx: CallContext, payload: bytes) -> None:
            notes.append(payload)

        conn, _ = await connect_async(path, "t", {"note": note})
        msgs = [f"m{i}".encode() * (i % 7 + 1) for i in range(300)]
        replies = await asyncio.gather(*(conn.call("echo", m) for m in msgs))
        assert [r[0] for r in replies] == msgs
        assert notes == msgs  # every push arrived, in order, before its reply resolved
        assert (await conn.call("empty"))[0] == b""
        conn.close()

    _run(runtime_dir, body)


def test_frames_near_the_bound_and_over_it(runtime_dir: Path) -> None:
    async def body(path: str, srv: RpcServer) -> None:
        conn, _ = await connect_async(path, "t", max_frame=64 * 1024)
        big = os.urandom(60_000)  # echoed and pushed: the peer's buffer fills, writes queue
        out = await asyncio.gather(*(conn.call("echo", big) for _ in range(40)))
        assert all(r[0] == big for r in out)
        with pytest.raises(ProtocolError, match="exceeds"):
            await conn.call("echo", b"x" * 70_000)  # refused before it is sent
        assert (await conn.call("echo", b"still"))[0] == b"still"
        conn.close()
        # A peer that ignores the bound is cut off, and only it.
        other, _ = await connect_async(path, "t")
        with pytest.raises(ServiceUnavailable):
            await other.call("echo", b"x" * 70_000)
        assert other.closed

    _run(runtime_dir, body, max_frame=64 * 1024)


def test_fds_both_ways_interleaved_with_plain_frames(runtime_dir: Path) -> None:
    async def body(path: str, srv: RpcServer) -> None:
        conn, _ = await connect_async(path, "t")
        pipes = [os.pipe() for _ in range(6)]
        for i, (_r, w) in enumerate(pipes):
            os.write(w, f"p{i}".encode())
            os.close(w)
        calls = []
        for i in range(3):  # fd frames between fd-less ones: fds go with the right frame
            calls.append(conn.call("echo", b"plain%d" % i))
            calls.append(conn.call("fds", b"", fds=[pipes[2 * i][0], pipes[2 * i + 1][0]]))
        out = [r[0] for r in await asyncio.gather(*calls)]
        for r, _w in pipes:
            os.close(r)
        assert out == [b"plain0", b"p0|p1", b"plain1", b"p2|p3", b"plain2", b"p4|p5"]
        payload, fds = await conn.call("give_fd", b"from server")
        assert payload == b"" and len(fds) == 1
        assert os.read(fds[0], 100) == b"from server"
        os.close(fds[0])
        conn.close()

    _run(runtime_dir, body)


def test_gate_refuses_calls_and_ignores_pushes_before_hello(runtime_dir: Path) -> None:
    async def body(path: str, srv: RpcServer) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(path)
        s.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(s, encode(WireFrame(PUSH, 0, "echo", b"sneaky"))
                                + encode(WireFrame(REQUEST, 9, "echo", b"x"))
                                + encode(WireFrame(REQUEST, 10, "nope", b"")))
        data = b""
        while data.count(b"ProtocolError") < 2:
            data += await loop.sock_recv(s, 4096)
        first = parse_frame(data[4:4 + int.from_bytes(data[:4], "big")])
        assert first.call_id == 9 and "before hello" in first.error_message
        assert b"unknown method 'nope'" in data
        s.close()

    _run(runtime_dir, body)


def test_lost_connection_fails_waiting_and_later_calls(runtime_dir: Path) -> None:
    async def body(path: str, srv: RpcServer) -> None:
        conn, _ = await connect_async(path, "t")
        closed: list[BaseException | None] = []
        conn.on_close = lambda c, exc: closed.append(exc)
        (server_side,) = srv.connections
        waiting = asyncio.ensure_future(conn.call("never"))  # unknown method: answered
        with pytest.raises(ProtocolError):
            await waiting
        pending = conn._loop.create_future()
        conn._calls[999] = pending  # a call the server will never answer
        server_side.close()
        with pytest.raises(ServiceUnavailable):
            await asyncio.wait_for(pending, 5)
        with pytest.raises(ServiceUnavailable):
            await conn.call("echo", b"x")
        assert conn.closed and len(closed) == 1
        conn.push("echo", b"dropped silently")  # never raises once closed

    _run(runtime_dir, body)


def test_error_reply_keeps_the_connection(runtime_dir: Path) -> None:
    async def body(path: str, srv: RpcServer) -> None:
        conn: RpcConnection
        conn, _ = await connect_async(path, "t")
        with pytest.raises(InvalidArgument, match="bad"):
            await conn.call("echo", b"bad")
        assert (await conn.call("echo", b"ok"))[0] == b"ok"
        conn.close()

    _run(runtime_dir, body)
