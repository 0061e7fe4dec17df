"""Attack 9: a hostile client writing garbage into its burst's shared memory.

A burst's request area, header and tensors live in memory the client can rewrite
at any moment, and its doorbell is a socket it can flood or stop reading. Every
case below must get a typed error in the response area (or be served), never crash,
hang or slow the driver for others: the attacker's burst keeps serving it, the
driver keeps its pid and fd count, and another uid's app is served meanwhile."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from npumanager import ModelLoadRequest, NpuManager, nn
from npumanager.errors import LimitExceeded, NpuError
from npumanager.nn.burst import Burst
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.tensorio import burst as layout
from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model
from tests.security.conftest import StartDaemon
from tests.security.harness import (
    ATTACKER,
    Lifecycle,
    assert_device_served,
    driver_pid,
    fd_count,
    needs_root,
    wait_for_fds_at_most,
)

pytestmark = needs_root

X = np.arange(4, dtype=np.float32).reshape(1, 4)


def _raw(b: Burst, request: bytes | None, length: int | None = None) -> str:
    """Write ``request`` (and/or a length) into the burst's memory by hand, ring, and
    return what the driver answered: the error type, or "ok"."""
    pool, sock = b._pool, b._sock
    assert pool is not None and sock is not None
    if request is not None:
        pool.buf[layout.HEADER:layout.HEADER + len(request)] = request
    b._seq += 1
    layout.write_request_header(pool.buf, b._seq, len(request or b"") if length is None
                                else length)
    sock.send(b"\1")
    status, n = b._wait(b._seq, pool.buf, sock)
    if status in (layout.OK, layout.SAME):  # SAME: served, outputs where they were
        return "ok"
    at = layout.HEADER + b._req
    return pb.BurstError.FromString(bytes(pool.buf[at:at + n])).type


def _execute(b: Burst, **kw: Any) -> bytes:
    assert b._pool is not None
    msg = pb.Execute(model_id=1, **kw)
    return msg.SerializeToString()


def hostile_burst(rt: str) -> dict[str, Any]:
    with NpuManager(rt, client_name="attacker") as mgr:
        req = ModelLoadRequest(id=1)
        cb = Lifecycle()
        mgr.request_can_load_model(req, cb)
        cb.wait_for("CAN_LOAD_NOW")
        dev = nn.device("reference", rt)
        model = dev.prepare_model(add_model(), grant=cb.listener)
        b = model.burst()
        out: dict[str, Any] = {"first": b.execute({"x": X})["y"].ravel().tolist()}
        pool = b._pool
        assert pool is not None
        size, pid = pool.size, pool.pool_id
        inline = pb.Tensor(name="x", dtype="float32", shape=[1, 4], data=X.tobytes())
        cases = {
            "not protobuf": (b"\xff" * 300, None),
            "empty": (b"", 0),
            "length past the area": (None, 1 << 31),
            "length of the whole memfd": (None, size),
            "offset past the memfd": (_execute(b, inputs=[pb.Tensor(
                name="x", dtype="float32", shape=[1, 4], pool_id=pid, offset=size - 8,
                nbytes=16)]), None),
            "huge shape": (_execute(b, inputs=[pb.Tensor(
                name="x", dtype="float32", shape=[1 << 30, 1 << 30], pool_id=pid, offset=0,
                nbytes=16)]), None),
            "another pool": (_execute(b, inputs=[pb.Tensor(
                name="x", dtype="float32", shape=[1, 4], pool_id=pid + 1000, offset=0,
                nbytes=16)]), None),
            "output area outside": (_execute(b, inputs=[inline], out_pool_id=pid,
                                             out_offset=size, out_capacity=1 << 40), None),
            "wrong input": (_execute(b, inputs=[pb.Tensor(
                name="nope", dtype="float32", shape=[1, 4], data=X.tobytes())]), None),
            "bad dtype": (_execute(b, inputs=[pb.Tensor(
                name="x", dtype="complex1024", shape=[1, 4], data=X.tobytes())]), None),
            "feedback to nowhere": (_execute(b, inputs=[inline], steps=5,
                                             feedback={"zz": "x"}), None),
            "attribution": (_execute(b, inputs=[inline], has_original_uid=True,
                                     original_uid=0), None),
        }
        out["errors"] = {name: _raw(b, data, length) for name, (data, length) in cases.items()}
        # Rewriting the request while the driver reads it: whatever it makes of it is
        # answered (typed), and the burst keeps working.
        good = _execute(b, inputs=[inline])
        stop = threading.Event()

        def scribble() -> None:
            junk = os.urandom(len(good))
            while not stop.is_set():
                pool.buf[layout.HEADER:layout.HEADER + len(good)] = junk
                pool.buf[layout.HEADER:layout.HEADER + len(good)] = good

        th = threading.Thread(target=scribble)
        th.start()
        raced = {_raw(b, None, len(good)) for _ in range(200)}
        stop.set()
        th.join()
        out["raced"] = sorted(raced)
        # A flooded doorbell that is never read: the driver never blocks on it.
        assert b._sock is not None
        b._sock.setblocking(False)
        sent = 0
        try:
            for _ in range(100_000):
                b._sock.send(b"\1")
                sent += 1
        except BlockingIOError:
            pass
        b._sock.setblocking(True)
        out["flooded"] = sent
        out["after"] = b.execute({"x": X})["y"].ravel().tolist()
        # More bursts than a connection may hold.
        extra = []
        try:
            for _ in range(20):
                extra.append(model.burst())
            out["bound"] = "none"
        except LimitExceeded as exc:
            out["bound"] = f"LimitExceeded: {exc}"
        for e in extra:
            e.close()
        b.close()
        model.release()
        dev.close()
        cb.listener.notify_model_unloaded(req)
        return out


def test_garbage_in_a_bursts_memory_gets_typed_errors_and_the_driver_serves_on(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud(drivers=True)
    driver = driver_pid(runtime_dir)
    out = procs.run_as(ATTACKER, None, hostile_burst, str(runtime_dir), timeout=120)
    assert out["first"] == out["after"] == [1.0, 2.0, 3.0, 4.0], out
    errors = out["errors"]
    assert set(errors.values()) <= {"InvalidArgument", "AttributionDenied"}, errors
    assert errors["attribution"] == "AttributionDenied", errors
    assert all(v == "InvalidArgument" for k, v in errors.items() if k != "attribution")
    assert set(out["raced"]) <= {"ok", "InvalidArgument"}, out["raced"]
    assert out["flooded"] > 0
    assert out["bound"].startswith("LimitExceeded"), out["bound"]
    assert driver_pid(runtime_dir) == driver, "the driver host survived"
    opened = int(out["bound"].split("may hold ")[1].split()[0])  # up to the bound
    assert npud.wait_for_output(lambda ln: "burst" in ln and f"uid {ATTACKER} ended" in ln,
                                count=opened, timeout=30), "a burst thread did not end"
    assert_device_served(runtime_dir)


def burst_then_die(rt: str) -> None:
    with NpuManager(rt, client_name="attacker") as mgr:
        req = ModelLoadRequest(id=1)
        cb = Lifecycle()
        mgr.request_can_load_model(req, cb)
        cb.wait_for("CAN_LOAD_NOW")
        dev = nn.device("reference", rt)
        model = dev.prepare_model(add_model(), grant=cb.listener)
        bursts = [model.burst() for _ in range(4)]
        for b in bursts:
            b.execute({"x": X})
        procs.announce("open")
        procs.receive(timeout=60)
        os._exit(0)  # no close, no release: the kernel closes everything


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    raise LookupError("no Threads line")


def test_a_client_that_dies_mid_burst_leaves_no_thread_or_fd_behind(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud(drivers=True)
    driver = driver_pid(runtime_dir)
    assert_device_served(runtime_dir)  # the driver's own threads (prepare, workers) exist
    fds, threads = fd_count(driver), _threads(driver)
    app = procs.spawn_as(ATTACKER, None, burst_then_die, str(runtime_dir))
    try:
        app.expect("open", timeout=60)
        assert _threads(driver) >= threads + 4, "a thread per burst"
        app.send("die")
        try:
            app.wait(timeout=30)
        except procs.ChildFailed:
            pass  # it exits without a result
    finally:
        app.kill()
    # Each burst thread's last act, after closing its fds, is this line.
    assert npud.wait_for_output(lambda ln: "burst" in ln and f"uid {ATTACKER} ended" in ln,
                                count=4, timeout=30), "a burst thread did not end"
    # The connection's own fds (its socket, its pools) close when the driver's loop takes
    # the hang-up, which may come after the burst threads saw theirs: wait for that, not a
    # count taken at a moment. (At most: the bystander's connection of the warm-up may have
    # closed since.)
    left = wait_for_fds_at_most(driver, fds, 30)
    assert left <= fds, f"{left} fds open, {fds} before: the bursts or their connection " \
                        "kept some"
    assert_device_served(runtime_dir)


def open_burst_raw(rt: str) -> dict[str, str]:
    """open_burst with what a burst must not be: no memfd, an unsealed one, areas that
    do not fit, a model of another connection."""
    from npumanager.hal.wire import SERVICE
    from npumanager.wire.client import SyncRpcClient

    rpc = SyncRpcClient(str(Path(rt) / "drivers" / "reference.sock"), SERVICE)
    out: dict[str, str] = {}

    def attempt(name: str, msg: pb.OpenBurst, fds: list[int]) -> None:
        try:
            rpc.call("device.open_burst", msg, fds=fds)
            out[name] = "opened"
        except NpuError as exc:
            out[name] = type(exc).__name__

    try:
        unsealed = os.memfd_create("x", os.MFD_CLOEXEC)
        os.ftruncate(unsealed, 1 << 20)
        r, w = os.pipe()
        ok = pb.OpenBurst(model_id=1, size=1 << 20, req_size=4096, resp_size=4096)
        attempt("unsealed memfd", ok, [unsealed])
        attempt("a pipe", ok, [r])
        attempt("no fd", ok, [])
        from npumanager.tensorio import ClientPool

        pool = ClientPool(1 << 20)
        attempt("areas larger than the memfd",
                pb.OpenBurst(model_id=1, size=1 << 20, req_size=1 << 20, resp_size=4096),
                [pool.fd])
        attempt("tiny areas", pb.OpenBurst(model_id=1, size=1 << 20, req_size=16,
                                           resp_size=16), [pool.fd])
        attempt("size beyond the memfd", pb.OpenBurst(model_id=1, size=1 << 30,
                                                      req_size=4096, resp_size=4096),
                [pool.fd])
        attempt("someone else's model", ok, [pool.fd])
        for fd in (unsealed, r, w):
            os.close(fd)
        pool.close()
    finally:
        rpc.close()
    return out


def test_open_burst_refuses_what_a_burst_must_not_be(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True)
    out = procs.run_as(ATTACKER, None, open_burst_raw, str(runtime_dir), timeout=60)
    assert set(out.values()) == {"InvalidArgument"}, out
    assert_device_served(runtime_dir)
