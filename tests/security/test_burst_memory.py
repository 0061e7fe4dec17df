"""Attack 9 (continued): a burst's request naming memory that is not the burst's to name.

A burst request names its tensors by (pool id, offset, length) and its output area the
same way. Ids are small integers anyone can guess, offsets and lengths are uint64s the
client picks. The driver must answer every request that names bytes outside a pool of the
burst's own connection, a pool of another connection (same uid or not), or the burst's
own control areas (header, request, response: the driver reads them) with InvalidArgument,
write nothing there, and serve on. Another uid's model and burst ids are as good as
nonexistent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from npumanager import nn
from npumanager.errors import NpuError
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.tensorio import burst as layout
from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model
from tests.security.burst_apps import Raw, X, register_pool
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import granted
from tests.security.harness import (
    ATTACKER,
    BYSTANDER,
    assert_device_served,
    driver_pid,
    needs_root,
)

pytestmark = needs_root

U64 = (1 << 64) - 1


def odd_offsets(rt: str) -> dict[str, Any]:
    """Offsets and lengths at the uint64 edges, areas overlapping each other and the
    burst's control areas; what each got and what it wrote."""
    with granted(rt) as (dev, grant):
        model = dev.prepare_model(add_model(), grant=grant)
        r = Raw(model.burst())
        r2 = Raw(model.burst())  # another burst of the same connection
        size = r.pool.size
        x_at, out_at = r.slot(0), r.slot(1)
        r.put(x_at, X)
        cases: dict[str, bytes] = {
            "input at 2**64-8": r.request(U64 - 7),
            "input at the end": r.request(size - 8),
            "nbytes of a huge shape": pb.Execute(inputs=[pb.Tensor(
                name="x", dtype="float32", shape=[1 << 30, 1 << 30], pool_id=r.pool_id,
                offset=0, nbytes=1 << 62)]).SerializeToString(),
            "nbytes not the shape's": pb.Execute(inputs=[pb.Tensor(
                name="x", dtype="float32", shape=[1, 4], pool_id=r.pool_id, offset=x_at,
                nbytes=U64)]).SerializeToString(),
            "output area wraps": r.request(x_at, U64 - 63, cap=1 << 63),
            "output area of 2**64-1": r.request(x_at, out_at, cap=U64),
            "outputs over the header": r.request(x_at, 0),
            "outputs over the request area": r.request(x_at, layout.HEADER),
            "outputs over the response area": r.request(x_at, r.resp_at),
            "outputs over another burst's header": r.request(x_at, 0, out_pool=r2.pool_id),
            "outputs over another burst's response": r.request(x_at, r2.resp_at,
                                                               out_pool=r2.pool_id),
        }
        header = bytes(r.buf[:layout.HEADER])
        got: dict[str, Any] = {name: r.status(data) for name, data in cases.items()}
        # What is the client's own to alias: outputs over their own input, inputs read
        # from the burst's own header, outputs into another burst's data area.
        r.fill(out_at)
        got["outputs over the input"] = r.call(r.request(x_at, x_at))[0], r.get(x_at)
        r.put(x_at, X)
        got["input from the header"] = r.status(r.request(0, out_at))
        got["outputs into another burst's data"] = (
            r.status(r.request(x_at, r2.slot(1), out_pool=r2.pool_id)), r2.get(r2.slot(1)))
        # The other burst still answers its own requests (its header was never written).
        r2.put(r2.slot(0), X)
        got["other burst"] = r2.status(r2.request(r2.slot(0), r2.slot(2)))
        got["magic kept"] = bytes(r.buf[:8]) == header[:8]
        got["after"] = model.burst().execute({"x": X})["y"].ravel().tolist()
        return got


def test_offsets_and_areas_outside_or_over_the_control_areas_are_refused(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True)
    driver = driver_pid(runtime_dir)
    got = procs.run_as(ATTACKER, None, odd_offsets, str(runtime_dir), timeout=60)
    refused = [k for k in got if k.startswith(("input at", "nbytes", "output area",
                                               "outputs over the", "outputs over another"))
               and k != "outputs over the input"]
    assert len(refused) == 11, got
    assert {k: got[k] for k in refused} == dict.fromkeys(refused, "InvalidArgument"), got
    assert got["outputs over the input"] == ("OK", [1.0, 2.0, 3.0, 4.0]), got
    assert got["input from the header"] == "OK", got
    assert got["outputs into another burst's data"] == ("OK", [1.0, 2.0, 3.0, 4.0]), got
    assert got["other burst"] == "OK" and got["magic kept"], got
    assert got["after"] == [1.0, 2.0, 3.0, 4.0], got
    assert driver_pid(runtime_dir) == driver
    assert_device_served(runtime_dir)


def pool_holder(rt: str) -> list[float]:
    """As the bystander: a pool of its own with known bytes, its id announced; what the
    pool holds when the test says the attack is over, and an execute through it."""
    with granted(rt, request_id=2) as (dev, grant):
        model = dev.prepare_model(add_model(), grant=grant)
        pool = register_pool(dev, dev.connection())
        pool.buf[0:16] = X.tobytes()
        pool.buf[64:80] = bytes(16)
        procs.announce(("pool", pool.pool_id))
        procs.receive(timeout=60)
        out = model.execute({"x": X})["y"].ravel().tolist()
        held = np.frombuffer(pool.buf, np.float32, 20).tolist()
        return [*held[:4], *held[16:], *out]


def foreign_pools(rt: str, victim_pool: int) -> dict[str, Any]:
    """As the attacker: a burst naming pools of its other connection, of the bystander,
    and every small id, for inputs and outputs."""
    with granted(rt) as (dev, grant):
        model = dev.prepare_model(add_model(), grant=grant)
        r = Raw(model.burst())
        other = nn.device("reference", rt)  # a second connection of the same uid
        mine_elsewhere = register_pool(other, other.connection())
        r.put(r.slot(0), X)
        got: dict[str, Any] = {
            "input, my other connection": r.status(r.request(0, x_pool=mine_elsewhere.pool_id)),
            "output, my other connection": r.status(r.request(
                r.slot(0), 0, out_pool=mine_elsewhere.pool_id)),
            "input, another uid": r.status(r.request(0, x_pool=victim_pool)),
            "output, another uid": r.status(r.request(r.slot(0), 64, out_pool=victim_pool)),
        }
        guesses = {}
        for pid in range(1, 65):
            if pid != r.pool_id:
                guesses[pid] = (r.status(r.request(0, x_pool=pid)),
                                r.status(r.request(r.slot(0), 64, out_pool=pid)))
        got["guesses"] = sorted(set(guesses.values()))
        got["own"] = r.call(r.request(r.slot(0), r.slot(1)))[0], r.get(r.slot(1))
        got["other connection's pool"] = bytes(mine_elsewhere.buf[:16]) == bytes(16)
        other.close()
        return got


def test_a_burst_cannot_name_a_pool_of_another_connection_or_uid(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True)
    rt = str(runtime_dir)
    victim = procs.spawn_as(BYSTANDER, None, pool_holder, rt, timeout=120)
    try:
        _, victim_pool = victim.expect(lambda e: isinstance(e, tuple) and e[0] == "pool", 60)
        got = procs.run_as(ATTACKER, None, foreign_pools, rt, victim_pool, timeout=60)
        victim.send("done")
        held = victim.wait(60)
    finally:
        victim.kill()
    assert {k: v for k, v in got.items() if k.startswith(("input", "output"))} == {
        "input, my other connection": "InvalidArgument",
        "output, my other connection": "InvalidArgument",
        "input, another uid": "InvalidArgument",
        "output, another uid": "InvalidArgument"}, got
    assert got["guesses"] == [("InvalidArgument", "InvalidArgument")], got
    assert got["own"] == ("OK", [1.0, 2.0, 3.0, 4.0]), got
    assert got["other connection's pool"], got
    # The bystander's pool holds what it wrote; its execute is served.
    assert held == [0.0, 1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0, 4.0], held


def burst_owner(rt: str) -> dict[str, Any]:
    """As the bystander: a model and a burst, their ids announced; its burst's answers
    after the attacker tried them."""
    with granted(rt, request_id=2) as (dev, grant):
        model = dev.prepare_model(add_model(), grant=grant)
        b = model.burst()
        first = b.execute({"x": X})["y"].ravel().tolist()
        procs.announce(("ids", model.model_id, b.burst_id))
        procs.receive(timeout=60)
        return {"first": first, "after": b.execute({"x": X})["y"].ravel().tolist()}


def intrude_burst(rt: str, model_id: int, burst_id: int) -> dict[str, str]:
    """As the attacker: open a burst on the bystander's model, close its burst, and send
    its model id inside a request of a burst of its own."""
    with granted(rt) as (dev, grant):
        mine = dev.prepare_model(add_model(4, 100.0), grant=grant)
        rpc = dev.connection()
        from npumanager.tensorio import ClientPool

        def attempt(method: str, msg: Any, fds: list[int]) -> str:
            try:
                dev.call(rpc, method, msg, fds=fds)
                return "ok"
            except NpuError as exc:
                return type(exc).__name__

        pool = ClientPool(1 << 20)
        got = {
            "open on its model": attempt("device.open_burst", pb.OpenBurst(
                model_id=model_id, size=1 << 20, req_size=4096, resp_size=4096), [pool.fd]),
            "close its burst": attempt("device.close_burst", pb.BurstId(burst_id=burst_id), []),
        }
        pool.close()
        r = Raw(mine.burst())
        status, result = r.call(pb.Execute(
            model_id=model_id, inputs=[pb.Tensor(name="x", dtype="float32", shape=[1, 4],
                                                 data=X.tobytes())]).SerializeToString())
        got["its model id in my request"] = f"{status} {r.outputs(result)}"
        got["my burst"] = str(mine.burst().execute({"x": X})["y"].ravel().tolist())
        return got


def test_another_uids_model_and_burst_ids_are_nobodys(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True)
    rt = str(runtime_dir)
    victim = procs.spawn_as(BYSTANDER, None, burst_owner, rt, timeout=120)
    try:
        _, model_id, burst_id = victim.expect(
            lambda e: isinstance(e, tuple) and e[0] == "ids", 60)
        got = procs.run_as(ATTACKER, None, intrude_burst, rt, model_id, burst_id, timeout=60)
        victim.send("done")
        out = victim.wait(60)
    finally:
        victim.kill()
    assert got["open on its model"] == "InvalidArgument", got
    assert got["close its burst"] == "InvalidArgument", got
    # The model id inside a burst's request is not read: a burst runs its own model.
    assert got["its model id in my request"] == "OK [100.0, 101.0, 102.0, 103.0]", got
    assert got["my burst"] == "[100.0, 101.0, 102.0, 103.0]", got
    assert out == {"first": [1.0, 2.0, 3.0, 4.0], "after": [1.0, 2.0, 3.0, 4.0]}, out
