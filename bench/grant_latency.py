"""Grant latency of npud, next to a raw Unix-socket echo measured in the same run.

    python bench/grant_latency.py [--quick]

Starts a real npud (`python -m npumanager serve --no-drivers`) in a temp runtime
dir and a raw echo server (uvloop, a Protocol that writes back what it reads)
in another process, then measures with asyncio clients (uvloop when installed):

* request -> CAN_LOAD_NOW round trip, p50/p99, with 1 and 32 clients, next to
  the raw echo round trip of a message of the request's frame size;
* full lifecycles per second (request, CAN_LOAD_NOW, loaded, unloaded,
  COMPLETE) with 32 clients, next to the raw echo rate (3 round trips = one
  lifecycle's calls);
* grant p99 with 10, 100, 1,000 and 10,000 requests queued (NOT_PRIORITIZED,
  ranked behind the measured requests), next to the raw echo p99.

Targets on a 2-core machine: grant p99 <= 2.5x raw; >= 5,000 lifecycles/s;
p99 at 10,000 queued <= 2x p99 at 10 queued.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from npumanager import (
    KEY_MAX_BUDGET,
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelPriority,
    ModelSize,
    Policy,
    RequestStatus,
)
from npumanager.client import AsyncNpuManager
from npumanager.proto.v1.manager_pb2 import LoadRequest
from npumanager.proto.v1.wire_pb2 import Frame
from npumanager.testing.daemon import DaemonProcess
from npumanager.wire.framing import REQUEST, encode

ECHO_SERVER = r"""
import asyncio, os, sys
try:
    import uvloop
    factory = uvloop.new_event_loop
except ImportError:
    factory = None
class Echo(asyncio.Protocol):
    def connection_made(self, t): self.t = t
    def data_received(self, d): self.t.write(d)
async def main(path):
    loop = asyncio.get_running_loop()
    srv = await loop.create_unix_server(Echo, path)
    # The same transport npud uses, with a handler that does nothing: the wire's share.
    from npumanager.wire.server import RpcServer
    rpc = RpcServer(path + ".rpc", "null", {"null": lambda ctx, p: p})
    await rpc.start()
    print("ready", flush=True)
    await asyncio.Event().wait()
with asyncio.Runner(loop_factory=factory) as r:
    r.run(main(sys.argv[1]))
"""


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop

        return uvloop.new_event_loop  # type: ignore[no-any-return]
    except ImportError:
        return None


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))
    return xs[k]


# --- raw echo ------------------------------------------------------------------


class _EchoClient(asyncio.Protocol):
    def __init__(self) -> None:
        self.want = 0
        self.got = 0
        self.waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.t: Any = transport

    def data_received(self, data: bytes) -> None:
        self.got += len(data)
        if self.got >= self.want and self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def roundtrip(self, msg: bytes) -> None:
        self.want, self.got = len(msg), 0
        self.waiter = asyncio.get_running_loop().create_future()
        self.t.write(msg)
        await self.waiter


class EchoClients:
    """``clients`` raw connections to the echo server, each sending ``msg`` and awaiting it."""

    def __init__(self, path: str, msg: bytes, clients: int) -> None:
        self.path, self.msg, self.clients = path, msg, clients
        self.protos: list[_EchoClient] = []

    async def open(self) -> EchoClients:
        loop = asyncio.get_running_loop()
        for _ in range(self.clients):
            _t, p = await loop.create_unix_connection(_EchoClient, self.path)
            self.protos.append(p)
        await self.latency(20)
        return self

    async def latency(self, n_each: int) -> list[float]:
        lat: list[float] = []

        async def run(p: _EchoClient) -> None:
            for _ in range(n_each):
                t0 = time.perf_counter()
                await p.roundtrip(self.msg)
                lat.append(time.perf_counter() - t0)

        await asyncio.gather(*(run(p) for p in self.protos))
        return lat

    async def rate(self, seconds: float) -> tuple[int, float]:
        count = 0
        stop = time.perf_counter() + seconds

        async def run(p: _EchoClient) -> None:
            nonlocal count
            while time.perf_counter() < stop:
                await p.roundtrip(self.msg)
                count += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(run(p) for p in self.protos))
        return count, time.perf_counter() - t0

    def close(self) -> None:
        for p in self.protos:
            p.t.close()


async def null_rpc_latency(path: str, payload_size: int, n: int) -> list[float]:
    from npumanager.wire.client import connect_async

    conn, _hello = await connect_async(path, "null")
    body = b"x" * payload_size
    lat = []
    for _ in range(50):
        await conn.call("null", body)
    for _ in range(n):
        t0 = time.perf_counter()
        await conn.call("null", body)
        lat.append(time.perf_counter() - t0)
    conn.close()
    return lat


# --- npud ------------------------------------------------------------------------


class _Cb(ModelLoadRequestCallback):
    """Resolves a future on CAN_LOAD_NOW (stamping the time) and on completion."""

    __slots__ = ("done", "granted", "t_granted")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.granted: asyncio.Future[Any] = loop.create_future()
        self.done: asyncio.Future[RequestStatus] = loop.create_future()
        self.t_granted = 0.0

    def on_can_load_model(self, request: ModelLoadRequest, status: LoadStatus,
                          listener: Any) -> None:
        if status == LoadStatus.CAN_LOAD_NOW:
            self.t_granted = time.perf_counter()
            self.granted.set_result(listener)

    def on_model_load_request_complete(self, request: ModelLoadRequest,
                                       status: RequestStatus) -> None:
        self.done.set_result(status)


class Ids:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        self.n += 1
        return self.n


async def grant_once(mgr: AsyncNpuManager, rid: int,
                     size: ModelSize = ModelSize.LESS_THAN_1GB) -> float:
    """One request -> CAN_LOAD_NOW (timed), then unloaded without loading -> COMPLETE."""
    loop = asyncio.get_running_loop()
    cb = _Cb(loop)
    req = ModelLoadRequest(rid, size)
    t0 = time.perf_counter()
    await mgr.request_can_load_model(req, cb)
    listener = await cb.granted
    dt = cb.t_granted - t0
    await listener.notify_model_unloaded(req)
    await cb.done
    return dt


class NpudClients:
    """``clients`` AsyncNpuManager connections to npud."""

    def __init__(self, rt: str, clients: int, ids: Ids) -> None:
        self.rt, self.clients, self.ids = rt, clients, ids
        self.mgrs: list[AsyncNpuManager] = []

    async def open(self) -> NpudClients:
        for _ in range(self.clients):
            self.mgrs.append(await AsyncNpuManager.connect(self.rt))
        await self.latency(20)
        return self

    async def latency(self, n_each: int) -> list[float]:
        lat: list[float] = []

        async def run(m: AsyncNpuManager) -> None:
            for _ in range(n_each):
                lat.append(await grant_once(m, self.ids()))

        await asyncio.gather(*(run(m) for m in self.mgrs))
        return lat

    async def lifecycles(self, seconds: float) -> tuple[int, float]:
        loop = asyncio.get_running_loop()
        count = 0
        stop = time.perf_counter() + seconds

        async def run(m: AsyncNpuManager) -> None:
            nonlocal count
            while time.perf_counter() < stop:
                cb = _Cb(loop)
                req = ModelLoadRequest(self.ids())
                await m.request_can_load_model(req, cb)
                listener = await cb.granted
                await listener.notify_model_loaded(req)
                await listener.notify_model_unloaded(req)
                if await cb.done == RequestStatus.COMPLETE:
                    count += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(run(m) for m in self.mgrs))
        return count, time.perf_counter() - t0

    async def close(self) -> None:
        for m in self.mgrs:
            await m.close()


async def interleaved(a: Callable[[], Any], b: Callable[[], Any],
                      rounds: int) -> tuple[list[float], list[float]]:
    """Alternate batches of two measurements so both see the same machine (noise, load)."""
    xa: list[float] = []
    xb: list[float] = []
    for _ in range(rounds):
        xa += await a()
        xb += await b()
    return xa, xb


async def fill_queue(rt: str, queued: int, ids: Ids) -> tuple[AsyncNpuManager, AsyncNpuManager]:
    """A holder takes 4 of a budget of 5 and ``queued`` BACKGROUND >2 GB requests wait
    behind it: they cannot fit, and rank behind the measured NORMAL <1 GB requests."""
    holder = await AsyncNpuManager.connect(rt)
    filler = await AsyncNpuManager.connect(rt)
    await holder.set_policy(Policy.BUDGET, {KEY_MAX_BUDGET: 5})
    hcb = _Cb(asyncio.get_running_loop())
    hreq = ModelLoadRequest(ids(), ModelSize.GREATER_THAN_2G)
    await holder.request_can_load_model(hreq, hcb)
    await (await hcb.granted).notify_model_loaded(hreq)
    ignore = ModelLoadRequestCallback()
    batch = []
    for _ in range(queued):
        batch.append(filler.request_can_load_model(
            ModelLoadRequest(ids(), ModelSize.GREATER_THAN_2G, ModelPriority.BACKGROUND), ignore))
        if len(batch) >= 256:
            await asyncio.gather(*batch)
            batch.clear()
    await asyncio.gather(*batch)
    counts = (await holder.dump())["counts"]
    assert counts["queued"] == queued, counts
    return holder, filler


def message_size() -> int:
    body = LoadRequest(request_id=123456, size=0, priority=0).SerializeToString()
    return len(encode(Frame(kind=REQUEST, call_id=123456, method="request", payload=body)))


def cpu_seconds(pid: int) -> float:
    """user + system CPU of a process (/proc/PID/stat), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(rt: str, echo_path: str, quick: bool,
                  npud_pid: int) -> list[tuple[str, str, str, str]]:
    msg = b"x" * message_size()
    rounds = 5 if quick else 20
    n1 = 200  # samples per round, 1 client
    n32 = 4 if quick else 8  # samples per client per round, 32 clients
    window = 0.2 if quick else 0.5
    rows: list[tuple[str, str, str, str]] = []
    ids = Ids()

    def us(x: float) -> str:
        return f"{x * 1e6:.0f} us"

    echo1 = await EchoClients(echo_path, msg, 1).open()
    nr, e = await interleaved(lambda: null_rpc_latency(echo_path + ".rpc", 5, n1),
                              lambda: echo1.latency(n1), rounds)
    for p in (50, 99):
        rows.append((f"null RPC p{p}, 1 client (wire only)", us(pct(nr, p)), us(pct(e, p)),
                     f"{pct(nr, p) / pct(e, p):.2f}x"))
    for clients, n in ((1, n1), (32, n32)):
        npud = await NpudClients(rt, clients, ids).open()
        echo = await EchoClients(echo_path, msg, clients).open()
        g, e = await interleaved(functools.partial(npud.latency, n),
                                 functools.partial(echo.latency, n), rounds)
        for p in (50, 99):
            gp, ep = pct(g, p), pct(e, p)
            rows.append((f"grant p{p}, {clients} client{'s' if clients > 1 else ''}",
                         us(gp), us(ep), f"{gp / ep:.2f}x"))
        if clients == 32:
            done = secs = 0.0
            edone = esecs = 0.0
            cpu_npud = cpu_self = 0.0
            for _ in range(rounds // 2 or 1):
                n0, s0 = cpu_seconds(npud_pid), time.process_time()
                c, t = await npud.lifecycles(window)
                cpu_npud += cpu_seconds(npud_pid) - n0
                cpu_self += time.process_time() - s0
                done, secs = done + c, secs + t
                c, t = await echo.rate(window)
                edone, esecs = edone + c, esecs + t
            rate, erate = done / secs, edone / esecs / 3
            rows.append(("lifecycles/s, 32 clients", f"{rate:,.0f}/s",
                         f"{erate:,.0f}/s (echo/3)", f"{rate / erate:.2f}x"))
            # CPU per lifecycle is what a busy machine cannot distort much.
            rows.append(("  CPU per lifecycle: npud / clients",
                         f"{cpu_npud / done * 1e6:.0f} / {cpu_self / done * 1e6:.0f} us",
                         "", ""))
        await npud.close()
        echo.close()
    base_p99: float | None = None
    for q in (10, 100, 1000, 10000):
        holder, filler = await fill_queue(rt, q, ids)
        npud = await NpudClients(rt, 1, ids).open()
        g, e = await interleaved(functools.partial(npud.latency, 100),
                                 functools.partial(echo1.latency, 100), rounds)
        await npud.close()
        await filler.close()
        await holder.set_policy(Policy.BUDGET, {KEY_MAX_BUDGET: 64})
        await holder.close()
        gp, ep = pct(g, 99), pct(e, 99)
        base_p99 = base_p99 or gp
        rows.append((f"grant p99, {q:,} queued", us(gp), us(ep),
                     f"{gp / ep:.2f}x (vs 10 queued {gp / base_p99:.2f}x)"))
    echo1.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples (a smoke run)")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="npu-bench-", dir="/tmp"))
    os.chmod(tmp, 0o755)
    echo_path = str(tmp / "echo.sock")
    echo = subprocess.Popen([sys.executable, "-c", ECHO_SERVER, echo_path],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert echo.stdout is not None and "ready" in echo.stdout.readline()
        config = {
            "manager": {"log_level": "warning", "max_requests_per_uid": 50000,
                        "decision_log_size": 10000},
            "policy": {"name": "BUDGET", "max_budget": 64},
        }
        with DaemonProcess(tmp / "rt", config) as npud:
            rows = _run(str(npud.runtime_dir), echo_path, args.quick, npud.pid)
    finally:
        echo.terminate()
        echo.wait()
        if echo.stdout is not None:
            echo.stdout.close()
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"npud grant latency (message {message_size()} bytes; "
          f"{os.cpu_count()} CPUs; uvloop: {_loop_factory() is not None})")
    widths = [max(len(r[i]) for r in [*rows, HEADER]) for i in range(4)]
    for r in [HEADER, tuple("-" * w for w in widths), *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    return 0


HEADER = ("measurement", "npud", "raw echo", "ratio")


def _run(rt: str, echo_path: str, quick: bool,
         npud_pid: int) -> list[tuple[str, str, str, str]]:
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(measure(rt, echo_path, quick, npud_pid))


if __name__ == "__main__":
    raise SystemExit(main())

