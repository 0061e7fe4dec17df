"""Building blocks of the burst attacks (tests/security/test_burst_*.py): a burst driven by
hand (its request area, header and doorbell written as a hostile client would), and the
driver's load as root sees it.

``Raw`` speaks the burst protocol of :mod:`npumanager.tensorio.burst` itself: it writes a
request (any bytes, any length), rings, and reads what the driver answered, so a test can
send what the client runtime never would, at the moment it chooses."""

from __future__ import annotations

import json
import os
import socket
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from npumanager import tensorio
from npumanager.errors import ServiceUnavailable
from npumanager.hal.wire import SERVICE
from npumanager.nn.burst import _MIN_AREA, Burst
from npumanager.paths import driver_socket
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.tensorio import burst as layout
from npumanager.testing import procs
from npumanager.wire.client import SyncRpcClient

X = np.arange(4, dtype=np.float32).reshape(1, 4)
#: What the driver never writes (an output slot that still holds it was not written).
SENTINEL = -7.0
#: The reference driver with one channel: a job keeps it, another one queues.
ONE_CHANNEL = [{"name": "reference", "plugin": "reference", "channels": 1}]


class Raw:
    """A burst's channel driven by hand (the client's memory and doorbell of ``b``)."""

    def __init__(self, b: Burst) -> None:
        assert b._pool is not None and b._sock is not None
        self.b = b
        self.pool = b._pool
        self.buf = b._pool.buf
        self.pool_id = b._pool.pool_id
        self.sock: socket.socket = b._sock
        self.data_start = b._data_start
        self.resp_at = layout.HEADER + b._req
        self.seq = b._seq

    # --- the memory ----------------------------------------------------------------

    def slot(self, n: int) -> int:
        """The offset of the ``n``-th 4 KiB slot of the data area."""
        return self.data_start + 4096 * n

    def put(self, offset: int, a: np.ndarray) -> None:
        self.buf[offset:offset + a.nbytes] = a.tobytes()

    def get(self, offset: int, n: int = 4) -> list[float]:
        return np.frombuffer(self.buf, np.float32, n, offset).tolist()

    def fill(self, offset: int, n: int = 4) -> None:
        """``n`` floats of SENTINEL at ``offset``."""
        self.put(offset, np.full(n, SENTINEL, np.float32))

    def request(self, x_at: int | None = None, out_at: int | None = None, *,
                x_pool: int | None = None, out_pool: int | None = None, cap: int = 4096,
                name: str = "x", **kw: Any) -> bytes:
        """An Execute: input ``name`` (float32 [1, 4]) from the pool at ``x_at`` (inline X
        when None), outputs into ``out_at`` (the driver's choice when None)."""
        msg = pb.Execute(model_id=self.b.model.model_id, **kw)
        if x_at is None:
            msg.inputs.add(name=name, dtype="float32", shape=[1, 4], data=X.tobytes())
        else:
            msg.inputs.add(name=name, dtype="float32", shape=[1, 4], offset=x_at, nbytes=16,
                           pool_id=self.pool_id if x_pool is None else x_pool)
        if out_at is not None:
            msg.out_pool_id = self.pool_id if out_pool is None else out_pool
            msg.out_offset, msg.out_capacity = out_at, cap
        return msg.SerializeToString()

    def outputs(self, result: pb.ExecuteResult) -> list[float]:
        """The first output of a full answer: inline, or where it says in this burst."""
        t = result.outputs[0]
        if t.pool_id == 0:
            return np.frombuffer(t.data, np.float32).tolist()
        assert t.pool_id == self.pool_id, t
        return self.get(t.offset, t.nbytes // 4)

    def write(self, data: bytes) -> None:
        self.buf[layout.HEADER:layout.HEADER + len(data)] = data

    # --- the doorbell ----------------------------------------------------------------

    def ring(self, data: bytes | None = None, length: int | None = None) -> int:
        """Write ``data`` (if any), a new sequence number with ``length`` (default: the
        data's), ring once; the sequence number."""
        if data is not None:
            self.write(data)
        self.seq += 1
        layout.write_request_header(self.buf, self.seq,
                                    len(data or b"") if length is None else length)
        self.sock.send(b"\1")
        return self.seq

    def answer(self, seq: int) -> tuple[str, Any]:
        """Wait for the answer to ``seq``: ("OK", ExecuteResult), ("SAME", None) or (the
        error type, its message)."""
        status, n = self.b._wait(seq, self.buf, self.sock)
        if status == layout.SAME:
            return "SAME", None
        payload = bytes(self.buf[self.resp_at:self.resp_at + n])
        if status == layout.OK:
            return "OK", pb.ExecuteResult.FromString(payload)
        err = pb.BurstError.FromString(payload)
        return err.type, err.message

    def call(self, data: bytes | None = None, length: int | None = None) -> tuple[str, Any]:
        return self.answer(self.ring(data, length))

    def status(self, data: bytes | None = None, length: int | None = None) -> str:
        return self.call(data, length)[0]


def register_pool(dev: Any, rpc: Any, size: int = 1 << 16) -> tensorio.ClientPool:
    """A pool of its own registered on ``rpc``'s connection (its id set)."""
    pool = tensorio.ClientPool(size)
    payload, _ = dev.call(rpc, "device.register_pool", pb.RegisterPool(size=size),
                          fds=[pool.fd])
    pool.pool_id = pb.PoolId.FromString(payload).pool_id
    return pool


def driver_load(runtime_dir: str | Path) -> dict[str, Any]:
    """device.stats as root sees it (channels busy, jobs queued). One retry: this observer
    is not what a test checks, and a connection opened while the machine stalled must not
    fail it."""
    for attempt in range(2):
        try:
            rpc = SyncRpcClient(str(driver_socket("reference", runtime_dir)), SERVICE)
        except ServiceUnavailable:
            if attempt:
                raise
            continue
        try:
            payload, _ = rpc.call("device.stats", Empty())
            return dict(json.loads(payload))
        finally:
            rpc.close()
    raise AssertionError("unreachable")


def threads_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise LookupError("no Threads line")


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise LookupError("no VmRSS line")


def close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


# --- floods of the largest requests a burst may have (test_burst_flood, test_burst_areas)


def value_bomb(size: int) -> bytes:
    """An Execute of ``size`` bytes or a little less: one sequence input of float32
    scalars, each a message of its own (a Python object each once decoded)."""
    elem = pb.Value(tensor=pb.Tensor(dtype="float32", data=bytes(4))).SerializeToString()
    one = b"\x0a" + bytes([len(elem)]) + elem  # Sequence.elements (field 1), length, bytes
    seq = pb.Sequence.FromString(one * ((size - 64) // len(one)))
    return pb.Execute(values=[pb.Value(name="x", sequence=seq)]).SerializeToString()


def max_area_raws(model: Any, n: int) -> list[Raw]:
    """``n`` bursts of ``model`` with the largest request area allowed, driven by hand."""
    raws = []
    for _ in range(n):
        b = model.burst()
        b._close_channel()  # (its channel reopened with the area asked for)
        b._open(layout.MAX_REQUEST_AREA, _MIN_AREA, _MIN_AREA)
        raws.append(Raw(b))
    return raws


def bombard_until_told(raws: Sequence[Raw], bombs: Sequence[bytes]) -> list[str]:
    """Each burst rings its bomb (``bombs[i % len(bombs)]``) without end, from a thread of
    its own; announce "bombing", stop when told; the answers' types, in order."""
    stop, answers = threading.Event(), []

    def bombard(r: Raw, bomb: bytes) -> None:
        while not stop.is_set():
            answers.append(r.status(bomb))

    threads = [threading.Thread(target=bombard, args=(r, bombs[i % len(bombs)]))
               for i, r in enumerate(raws)]
    for t in threads:
        t.start()
    procs.announce("bombing")
    procs.receive(timeout=120)
    stop.set()
    for t in threads:
        t.join(60)
    return answers
