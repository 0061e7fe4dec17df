"""Attack 9 (continued): a burst's doorbell and lifetime abused.

Each burst is a thread and a mapping in the driver host, woken by a doorbell the client
can ring as often as it likes and must read from. A hostile client floods the doorbell,
never reads the driver's rings, opens as many bursts as it can from many connections,
drops its end of a burst (or its memory) while a job of it runs, or unregisters the
burst's memory as if it were a plain pool. Each time: another uid's executions are
served meanwhile, the attacker's requests get typed answers, and what the driver holds
for the attacker (threads, fds, mappings) goes back once the attacker lets go."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from npumanager import nn
from npumanager.drivers.burst import MAX_BURSTS_PER_CONN, MAX_BURSTS_PER_UID
from npumanager.errors import LimitExceeded, NpuError
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.tensorio import burst as layout
from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model, step_model
from tests.security.burst_apps import (
    Raw,
    X,
    bombard_until_told,
    driver_load,
    max_area_raws,
    value_bomb,
)
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import granted, outcome, wait_until
from tests.security.harness import (
    ATTACKER,
    BYSTANDER,
    assert_device_served,
    driver_pid,
    fd_count,
    needs_root,
    wait_for_fds_at_most,
)

pytestmark = needs_root


def _ended(uid: int) -> Any:
    return lambda ln: "burst" in ln and f"uid {uid} ended" in ln


def bystander_bursts(rt: str, n: int = 30) -> list[list[float]]:
    """As the bystander: ``n`` executions through a burst of its own (y = x + 1)."""
    with granted(rt, request_id=2) as (dev, grant):
        model = dev.prepare_model(add_model(), grant=grant)
        with model.burst() as b:
            return [b.execute({"x": X + i})["y"].ravel().tolist() for i in range(n)]


def flooder(rt: str) -> dict[str, Any]:
    """Ring one burst's doorbell without end (no new request) and ring another with a new
    garbage request each time without waiting, never reading a ring back, until told."""
    procs.dump_stacks_on_usr1()
    with granted(rt) as (dev, grant):
        model = dev.prepare_model(add_model(4, 100.0), grant=grant)
        b, junk = model.burst(), Raw(model.burst())
        junk.write(b"\xff" * 64)
        assert b._sock is not None
        sock, stop, sent = b._sock, threading.Event(), [0, 0]

        def rings() -> None:
            while not stop.is_set():
                sock.send(b"\1")  # blocks while the driver's side is full
                sent[0] += 1

        def requests() -> None:
            while not stop.is_set():
                junk.seq += 1
                layout.write_request_header(junk.buf, junk.seq, 64)
                try:
                    junk.sock.send(b"\1", socket.MSG_DONTWAIT)
                except BlockingIOError:
                    pass
                sent[1] += 1

        threads = [threading.Thread(target=f) for f in (rings, requests)]
        for t in threads:
            t.start()
        wait_until(lambda: min(sent) >= 2000, 30, "both floods under way")
        procs.announce("flooding")
        procs.receive(timeout=60)
        stop.set()
        for t in threads:
            t.join(30)
        # Its own bursts answer on: the flooded one, and the junk one with a typed error.
        got = {"after": b.execute({"x": X})["y"].ravel().tolist(),
               "junk": junk.status(b"\xff" * 64), "sent": min(sent)}
        b.close()
        junk.b.close()
        return got


def test_a_flooded_doorbell_does_not_starve_another_uid(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud(drivers=True)
    rt = str(runtime_dir)
    driver = driver_pid(runtime_dir)
    app = procs.spawn_as(ATTACKER, None, flooder, rt, timeout=120)
    try:
        app.expect("flooding", 60)
        # Served while both floods go on: a plain execute and a stream of burst ones.
        assert_device_served(runtime_dir)
        out = procs.run_as(BYSTANDER, None, bystander_bursts, rt, timeout=60)
        app.send("stop")
        # CI (stop 19) and a full run here (1 in 2) saw this child not finish within 60 s
        # of "stop", never alone or beside busy loops: if it happens again, the failure
        # shows where the child (captured stderr) and the driver host (npud's log) were.
        try:
            got = app.wait(60, on_timeout=lambda: _stacks(app.pid, driver))
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; npud's log (the driver's stacks at its end):\n"
                                 + "\n".join(npud.lines[-400:])) from None
    finally:
        app.kill()
    assert out == [[float(i + 1 + k) for k in range(4)] for i in range(30)], out
    assert got["after"] == [100.0, 101.0, 102.0, 103.0], got
    assert got["junk"] == "InvalidArgument" and got["sent"] >= 2000, got
    # Each burst thread's last act, once its fds are closed, is this line.
    assert npud.wait_for_output(_ended(ATTACKER), count=2, timeout=30)
    assert npud.wait_for_output(_ended(BYSTANDER), count=1, timeout=30)
    assert driver_pid(runtime_dir) == driver


def _stacks(*pids: int) -> None:
    """``kill -USR1``: each process writes its threads' stacks (the driver host into
    npud's log) and carries on; a moment for them to land."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(2.0)


def many_bursts(rt: str, connections: int) -> dict[str, Any]:
    """Open bursts from ``connections`` connections until the driver refuses; hold them
    until told; then close one and open one again."""
    with granted(rt) as (_dev, grant):
        devs = [nn.device("reference", rt) for _ in range(connections)]
        bursts = []
        refused = ""
        try:
            for d in devs:
                m = d.prepare_model(add_model(), grant=grant)
                for _ in range(MAX_BURSTS_PER_CONN):
                    bursts.append(m.burst())
        except LimitExceeded as exc:
            refused = str(exc)
        procs.announce(("holding", len(bursts), refused))
        procs.receive(timeout=60)
        again = outcome(lambda: bursts[-1].model.burst().execute({"x": X})["y"].tolist())
        bursts.pop().close()
        after_close = outcome(lambda: bursts[-1].model.burst().execute({"x": X})["y"]
                              .ravel().tolist())
        for d in devs:
            d.close()
        return {"again": again, "after close": after_close}


def test_bursts_per_uid_are_bounded_and_another_uid_still_opens_one(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud(drivers=True)
    rt = str(runtime_dir)
    connections = MAX_BURSTS_PER_UID // MAX_BURSTS_PER_CONN + 2
    app = procs.spawn_as(ATTACKER, None, many_bursts, rt, connections, timeout=120)
    try:
        _, held, refused = app.expect(lambda e: isinstance(e, tuple) and e[0] == "holding",
                                      60)
        assert held == MAX_BURSTS_PER_UID, (held, refused)
        assert f"uid {ATTACKER} holds {MAX_BURSTS_PER_UID} bursts" in refused, refused
        out = procs.run_as(BYSTANDER, None, bystander_bursts, rt, 3, timeout=60)
        app.send("go")
        got = app.wait(60)
    finally:
        app.kill()
    assert out == [[float(i + 1 + k) for k in range(4)] for i in range(3)], out
    assert got["again"].startswith("LimitExceeded"), got
    assert got["after close"] == "ok: [1.0, 2.0, 3.0, 4.0]", got
    # Every burst of the attacker ends with its connections (and the one closed before).
    assert npud.wait_for_output(_ended(ATTACKER), count=MAX_BURSTS_PER_UID + 1, timeout=30)


def never_reads(rt: str, n: int) -> dict[str, Any]:
    """``n`` executions whose answers are read from the memory alone, the driver's rings
    never taken off the doorbell: the driver's side of it fills up."""
    with granted(rt) as (dev, grant):
        model = dev.prepare_model(add_model(), grant=grant)
        b = model.burst()
        r = Raw(b)
        r.put(r.slot(0), X)
        req = r.request(r.slot(0), r.slot(1))
        r.write(req)
        answered = 0
        for _ in range(n):
            seq = r.ring(None, len(req))
            while layout.read_response_header(r.buf)[0] != seq:
                pass  # (spins: a client that never reads its doorbell)
            answered += 1
        pending = 0
        r.sock.setblocking(False)
        try:
            while r.sock.recv(16):
                pending += 1
        except BlockingIOError:
            pass
        r.sock.setblocking(True)
        return {"answered": answered, "pending": pending, "out": r.get(r.slot(1)),
                "after": b.execute({"x": X})["y"].ravel().tolist()}


def test_a_client_that_never_reads_its_doorbell_never_blocks_the_driver(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True)
    n = 1500
    got = procs.run_as(ATTACKER, None, never_reads, str(runtime_dir), n, timeout=60)
    assert got["answered"] == n, got
    # Fewer rings than answers wait on the doorbell: the driver found its side full and
    # went on (it never blocks on a client's socket).
    assert 0 < got["pending"] < n, got
    assert got["out"] == [1.0, 2.0, 3.0, 4.0] and got["after"] == [1.0, 2.0, 3.0, 4.0], got
    assert_device_served(runtime_dir)


def drop_mid_run(rt: str) -> dict[str, str]:
    """Ring a long job through a burst, then close the doorbell and unmap and close the
    burst's memory while it runs (the connection stays); cancel it when told; then name
    the gone burst's memory in a plain execute and close the burst by id."""
    with granted(rt) as (dev, grant):
        model = dev.prepare_model(step_model(4, work_dim=32), grant=grant)
        b = model.burst()
        r = Raw(b)
        r.ring(r.request(None, name="state", steps=1_000_000,
                         feedback={"state_out": "state"}))
        procs.announce("running")
        procs.receive(timeout=60)
        b._pool = b._sock = None  # (so that nothing of the client runtime touches them)
        r.sock.close()
        r.pool.close()
        procs.announce("dropped")
        procs.receive(timeout=60)
        model.cancel()
        procs.announce("cancelled")
        procs.receive(timeout=60)  # the test saw the burst's thread end
        plain = pb.Execute(model_id=model.model_id, inputs=[pb.Tensor(
            name="state", dtype="float32", shape=[1, 4], pool_id=r.pool_id, offset=0,
            nbytes=16)])

        def call(method: str, msg: Any) -> str:
            try:
                dev.call(model._rpc, method, msg)
                return "ok"
            except NpuError as exc:
                return type(exc).__name__

        got = {"plain execute in its memory": call("device.execute", plain),
               "close it": call("device.close_burst", pb.BurstId(burst_id=b.burst_id)),
               "own model": outcome(lambda: model.execute(
                   {"state": np.zeros((1, 4), np.float32)})["state_out"].ravel().tolist())}
        return got


def test_a_burst_dropped_mid_run_ends_and_its_memory_is_gone(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud(drivers=True)
    rt = str(runtime_dir)
    driver = driver_pid(runtime_dir)
    assert_device_served(runtime_dir)
    fds = fd_count(driver)
    app = procs.spawn_as(ATTACKER, None, drop_mid_run, rt, timeout=120)
    try:
        app.expect("running", 60)
        wait_until(lambda: driver_load(rt)["busy"] >= 1, 30, "the burst's job running")
        app.send("drop")
        app.expect("dropped", 30)
        assert_device_served(runtime_dir)  # beside the job of the dropped burst
        app.send("cancel")
        app.expect("cancelled", 30)
        assert npud.wait_for_output(_ended(ATTACKER), timeout=30), "the burst went on"
        app.send("go")
        got = app.wait(60)
    finally:
        app.kill()
    assert got == {"plain execute in its memory": "InvalidArgument",
                   "close it": "InvalidArgument",
                   "own model": "ok: [1.0, 1.0, 1.0, 1.0]"}, got
    left = wait_for_fds_at_most(driver, fds, 30)
    assert left <= fds, (left, fds)
    assert_device_served(runtime_dir)


def unregister_burst_memory(rt: str) -> dict[str, Any]:
    """Unregister a burst's memory by its pool id, as if it were a plain pool (after the
    burst's answers went SAME: the driver keeps views of it)."""
    with granted(rt) as (dev, grant):
        model = dev.prepare_model(add_model(), grant=grant)
        b = model.burst()
        for _ in range(3):
            b.execute({"x": X})
        assert b._pool is not None
        dev.call(model._rpc, "device.unregister_pool", pb.PoolId(pool_id=b._pool.pool_id))
        procs.announce("unregistered")
        procs.receive(timeout=60)  # the test looked at the driver's mappings
        return {"burst": outcome(lambda: b.execute({"x": X})["y"].ravel().tolist()),
                "new burst": outcome(lambda: model.burst().execute({"x": X})["y"].ravel()
                                     .tolist())}


def _pool_mappings(pid: int) -> int:
    with open(f"/proc/{pid}/maps") as f:
        return sum("npu-pool" in line for line in f)


def test_a_bursts_memory_unregistered_as_a_pool_ends_the_burst(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud(drivers=True)
    rt = str(runtime_dir)
    driver = driver_pid(runtime_dir)
    before = _pool_mappings(driver)
    app = procs.spawn_as(ATTACKER, None, unregister_burst_memory, rt, timeout=60)
    try:
        app.expect("unregistered", 60)
        # No longer counted against the uid, so no longer mapped (nor served from).
        assert npud.wait_for_output(_ended(ATTACKER), timeout=30), "the burst went on"
        assert _pool_mappings(driver) == before
        app.send("go")
        got = app.wait(60)
    finally:
        app.kill()
    assert got["burst"].startswith("DeviceUnavailable"), got
    assert got["new burst"] == "ok: [1.0, 2.0, 3.0, 4.0]", got


def decode_bomber(rt: str, bursts: int) -> dict[str, Any]:
    """Ring requests that fill the largest request area a burst may have with tiny values
    (seconds of decoding each), from ``bursts`` bursts at once, until told."""

    with granted(rt) as (dev, grant):
        model = dev.prepare_model(add_model(), grant=grant)
        bomb = value_bomb(layout.MAX_REQUEST_AREA)
        answers = bombard_until_told(max_area_raws(model, bursts), [bomb])
        return {"answers": sorted(set(answers)), "size": len(bomb)}


def test_a_request_that_takes_seconds_to_decode_does_not_stall_another_uid(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    """Decoding a burst's request took the host's lock, which every execution of every uid
    takes: a 16 MiB request of tiny values held it for about 5 s per ring (request areas
    are now at most 1 MiB: test_burst_areas.py), and another
    uid's app could not even connect to the driver (its hello timed out after 10 s)."""
    start_npud(drivers=True)
    rt = str(runtime_dir)
    app = procs.spawn_as(ATTACKER, None, decode_bomber, rt, 1, timeout=180)
    try:
        app.expect("bombing", 60)
        # (Limits on time are the harness's: far beyond what these take while the
        # decoding leaves the lock alone, far below what they took while it held it.)
        out = procs.run_as(BYSTANDER, None, bystander_bursts, rt, 10, timeout=30)
        app.send("stop")
        got = app.wait(120)
    finally:
        app.kill()
    assert out == [[float(i + 1 + k) for k in range(4)] for i in range(10)], out
    assert got["answers"] == ["InvalidArgument"] and got["size"] > 900 << 10, got
    assert_device_served(runtime_dir)
