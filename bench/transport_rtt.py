"""Same-run transport baselines for bench/execute_overhead.py: a raw Unix socket round
trip and the transport's own RPC round trip (echo), each against a forked child."""

from __future__ import annotations

import asyncio
import os
import select
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def tight(fn: Callable[[], object], n: int) -> list[float]:
    """``n`` calls of ``fn`` back to back; the time of each."""
    out = []
    clock = time.perf_counter
    for _ in range(n):
        t = clock()
        fn()
        out.append(clock() - t)
    return out


def raw_socket_rtt(n: int) -> list[float]:
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        a.close()
        while True:
            d = b.recv(4096)
            if not d:
                os._exit(0)
            b.sendall(d)
    b.close()
    msg = b"x" * 64
    ts = tight(lambda: (a.sendall(msg), a.recv(4096)), n)
    a.close()
    os.waitpid(pid, 0)
    return ts


def rpc_echo_rtt(n: int, rt: Path) -> list[float]:
    from npumanager.wire.client import SyncRpcClient
    from npumanager.wire.server import RpcServer

    path = str(rt / "echo.sock")
    ready_r, ready_w = os.pipe()

    def serve() -> None:
        async def main() -> None:
            srv = RpcServer(path, "echo", {"echo": lambda ctx, p: p})
            await srv.start()
            os.write(ready_w, b"1")  # listening: the parent may connect
            await asyncio.sleep(3600)

        try:
            asyncio.run(main())
        except (asyncio.CancelledError, RuntimeError):
            pass

    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        serve()
        os._exit(0)
    os.close(ready_w)
    # The child says when it listens (its socket file appears before that: connecting
    # then could be refused).
    r, _, _ = select.select([ready_r], [], [], 30)
    ok = bool(r) and os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    if not ok:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        raise SystemExit("the echo server did not start")
    c = SyncRpcClient(path, "echo", threaded=False)
    ts = tight(lambda: c.call("echo", b"x" * 64), n)
    c.close()
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return ts
