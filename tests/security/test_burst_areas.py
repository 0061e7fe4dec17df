"""Attack 9 (continued): a burst's areas too large, and its memory named by plain executes.

- A burst's request area is parsed as one protobuf message by the burst's thread, holding
  the driver host's GIL all along (16 MiB: ~0.16 s, every other uid's executions stalled
  meanwhile). An area over 1 MiB (``MAX_REQUEST_AREA``) is refused with LimitExceeded, and
  a uid that floods the largest requests it may from several bursts leaves another uid's
  burst stream served.
- A burst's memory is registered as a pool of its connection (the burst's own requests
  name its data area by that pool id). A plain execute naming it, as an input or as its
  output area, would have the driver write over the burst's header, request and response
  areas, which the burst's thread reads: refused (InvalidArgument), nothing written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from npumanager.errors import NpuError
from npumanager.nn.burst import _MIN_AREA
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.tensorio import burst as layout
from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model
from tests.security.burst_apps import Raw, X, bombard_until_told, max_area_raws, value_bomb
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import granted, outcome
from tests.security.harness import (
    ATTACKER,
    BYSTANDER,
    assert_device_served,
    driver_pid,
    needs_root,
)
from tests.security.test_burst_flood import bystander_bursts

pytestmark = [needs_root, pytest.mark.timeout(400)]  # (a loaded 2-core machine: minutes)


def _blob(size: int) -> bytes:
    """An Execute of ``size`` bytes or a little less: one inline tensor whose bytes do not
    hold its shape (parsed whole, then refused)."""
    return pb.Execute(inputs=[pb.Tensor(name="x", dtype="float32", shape=[1, 4],
                                        data=bytes(size - 64))]).SerializeToString()


def large_areas(rt: str, bursts: int) -> dict[str, Any]:
    """Ask for request areas over the bound (through the client runtime and raw), then
    flood the largest requests the bound allows from ``bursts`` bursts, until told."""
    with granted(rt) as (dev, grant):
        model = dev.prepare_model(add_model(), grant=grant)
        got: dict[str, Any] = {}
        for name, req in (("one byte over", layout.MAX_REQUEST_AREA + 1),
                          ("16 MiB", 16 << 20)):
            b = model.burst()
            b._close_channel()  # (its channel reopened with the area asked for)
            got[name] = outcome(lambda b=b, req=req: b._open(req, _MIN_AREA, _MIN_AREA))
        raws = max_area_raws(model, bursts)
        bombs = [value_bomb(layout.MAX_REQUEST_AREA), _blob(layout.MAX_REQUEST_AREA)]
        got["sizes"] = [len(x) for x in bombs]
        answers = bombard_until_told(raws, bombs)
        got["answers"] = sorted(set(answers))
        got["rings"] = len(answers)
        got["after"] = model.burst().execute({"x": X})["y"].ravel().tolist()
        return got


def test_a_request_area_over_1_mib_is_refused_and_max_size_floods_leave_others_served(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True)
    rt = str(runtime_dir)
    driver = driver_pid(runtime_dir)
    app = procs.spawn_as(ATTACKER, None, large_areas, rt, 4, timeout=240)
    try:
        app.expect("bombing", 60)
        # A stream of another uid's burst executions and a plain one, all answered right,
        # while four bursts ring the largest requests they may without pause.
        out = procs.run_as(BYSTANDER, None, bystander_bursts, rt, 30, timeout=120)
        assert_device_served(runtime_dir)
        app.send("stop")
        got = app.wait(120)
    finally:
        app.kill()
    assert out == [[float(i + 1 + k) for k in range(4)] for i in range(30)], out
    for name in ("one byte over", "16 MiB"):
        assert got[name].startswith("LimitExceeded: a burst's request area is at most "
                                    f"{layout.MAX_REQUEST_AREA} bytes"), got
    assert all(layout.MAX_REQUEST_AREA - 128 <= n <= layout.MAX_REQUEST_AREA
               for n in got["sizes"]), got
    assert got["answers"] == ["InvalidArgument"] and got["rings"] >= 4, got
    assert got["after"] == [1.0, 2.0, 3.0, 4.0], got
    assert driver_pid(runtime_dir) == driver


def plain_into_burst_memory(rt: str) -> dict[str, Any]:
    """Plain executes (device.execute on the burst's own connection) that name the burst's
    memory: outputs over its header, its request area, its response area, its data area;
    an input read from it, top-level and nested in a value. What each got, and whether the
    burst's control areas and its data were written."""
    with granted(rt) as (dev, grant):
        model = dev.prepare_model(add_model(), grant=grant)
        b = model.burst()
        r = Raw(b)
        x_at, out_at = r.slot(0), r.slot(1)
        r.put(x_at, X)
        got: dict[str, Any] = {"burst before": r.status(r.request(x_at, out_at))}
        control = bytes(r.buf[:r.data_start])
        r.fill(r.slot(2))

        def plain(**kw: Any) -> str:
            msg = pb.Execute(model_id=model.model_id, **kw)
            try:
                dev.call(model._rpc, "device.execute", msg)
                return "ok"
            except NpuError as exc:
                return f"{type(exc).__name__}: {exc}"

        inline = [pb.Tensor(name="x", dtype="float32", shape=[1, 4], data=X.tobytes())]
        for name, at in (("header", 0), ("request area", layout.HEADER),
                         ("response area", r.resp_at), ("data area", r.slot(2))):
            got[f"outputs over its {name}"] = plain(
                inputs=inline, out_pool_id=r.pool_id, out_offset=at, out_capacity=4096)
        got["input from its data area"] = plain(inputs=[pb.Tensor(
            name="x", dtype="float32", shape=[1, 4], pool_id=r.pool_id, offset=x_at,
            nbytes=16)])
        got["input nested in a value"] = plain(values=[pb.Value(name="x", tensor=pb.Tensor(
            name="x", dtype="float32", shape=[1, 4], pool_id=r.pool_id, offset=x_at,
            nbytes=16))])
        got["control areas kept"] = bytes(r.buf[:r.data_start]) == control
        got["data area kept"] = r.get(r.slot(2))
        # The burst answers on, and plain executes of the model with memory of their own.
        r.fill(out_at)
        got["burst after"] = r.call(r.request(x_at, out_at))[0], r.get(out_at)
        got["plain after"] = model.execute({"x": X})["y"].ravel().tolist()
        got["burst through the runtime"] = b.execute({"x": X})["y"].ravel().tolist()
        b.close()
        return got


def test_a_plain_execute_cannot_name_a_bursts_memory(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True)
    got = procs.run_as(ATTACKER, None, plain_into_burst_memory, str(runtime_dir),
                       timeout=60)
    named = [k for k in got if k.startswith(("outputs over its", "input "))]
    assert len(named) == 6, got
    for k in named:
        assert got[k].startswith("InvalidArgument"), (k, got)
        if "nested" not in k:  # (a nested tensor's pool is one it cannot find)
            assert "burst" in got[k] and "memory" in got[k], (k, got)
    assert got["burst before"] == "OK", got
    assert got["control areas kept"], got
    assert got["data area kept"] == [-7.0] * 4, got
    assert got["burst after"] in (("OK", [1.0, 2.0, 3.0, 4.0]), ("SAME", [1.0, 2.0, 3.0, 4.0])), got
    assert got["plain after"] == [1.0, 2.0, 3.0, 4.0], got
    assert got["burst through the runtime"] == [1.0, 2.0, 3.0, 4.0], got
    assert_device_served(runtime_dir)

