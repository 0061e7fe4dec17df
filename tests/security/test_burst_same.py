"""Attack 9 (continued): a burst's request rewritten after the driver checked it, the kept
request and its SAME answers misused, and a burst that goes on after its model is gone.

The driver copies a burst's request out of the shared memory once, checks the copy and
runs only what the copy says (drivers/burst.py); it keeps the last request it parsed and,
when the client set FLAG_SAME, answers SAME ("the outputs lie where the last answer
said") to a repeat of the request it last answered in full (drivers/burst_fixed.py). So:

- bytes rewritten in the request area after the driver took its copy (the execution
  queued behind a more important job, the test sees it queued in device.stats) change
  nothing: it runs the request that was checked, its outputs land where that one said;
- SAME never answers a first execution, a request other than the last fully answered,
  or a request whose pool, model or burst changed; and every SAME execution ran;
- a burst of a released or revoked model gets typed errors and its outputs are never
  written, while the burst itself keeps answering."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np

from npumanager import ModelLoadRequest, NpuManager, nn
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.tensorio import burst as layout
from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model, step_model
from tests.security.burst_apps import ONE_CHANNEL, SENTINEL, Raw, X, driver_load, register_pool
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import granted, outcome, wait_until
from tests.security.harness import ATTACKER, Lifecycle, assert_device_served, needs_root

pytestmark = needs_root

UNTOUCHED = [SENTINEL] * 4


def settled(statuses: list[str]) -> bool:
    """A request's executions in a row: the first answered in full, the last SAME (the
    driver may answer a few in full before it answers SAME)."""
    return (statuses[0] == "OK" and statuses[-1] == "SAME"
            and set(statuses) <= {"OK", "SAME"})


def hog_job(hog: Any, result: dict[str, str]) -> None:
    """The only channel taken by a job more important than the burst's, until cancelled."""
    result["job"] = outcome(lambda: hog.execute(
        {"state": np.zeros((1, 4), np.float32)}, job_priority=0, steps=1_000_000,
        feedback={"state_out": "state"}))


def rewrite_after_the_check(rt: str) -> dict[str, Any]:
    """Twice (a request parsed afresh, then the kept one): ring a request that queues
    behind a job of its own, rewrite the request area and its length once the test saw it
    queued, then let it run."""
    with granted(rt) as (dev, grant):
        model = dev.prepare_model(add_model(), grant=grant)
        hog = dev.prepare_model(step_model(4), grant=grant)
        r = Raw(model.burst())
        x_at, out_at, evil_x, evil_out = r.slot(0), r.slot(1), r.slot(2), r.slot(3)
        r.put(x_at, X)
        r.put(evil_x, X + 100)
        r.fill(out_at)
        r.fill(evil_out)
        good = r.request(x_at, out_at, job_priority=500)  # less important than the hog
        # What the area says after the check: another request that would pass the checks
        # (other input, other outputs, more important), then garbage.
        evil = r.request(evil_x, evil_out, job_priority=0)
        rewrites = [evil, b"\xff" * 200, evil]
        out: dict[str, Any] = {}
        for n, rewrite in enumerate(rewrites):
            r.put(x_at, X * (n + 1))
            hogged: dict[str, str] = {}
            t = threading.Thread(target=hog_job, args=(hog, hogged))
            t.start()
            procs.announce("hogging")
            procs.receive(timeout=60)  # the test saw the hog on the only channel
            seq = r.ring(good)
            procs.announce("rung")
            procs.receive(timeout=60)  # the test saw the request queued: checked, copied
            r.write(rewrite)
            layout.write_request_header(r.buf, seq, len(rewrite))
            hog.cancel()
            t.join(30)
            out[f"hog {n}"] = hogged["job"].split(":")[0]
            status, _ = r.answer(seq)
            out[f"answer {n}"] = status
            out[f"out {n}"] = r.get(out_at)
            out[f"evil out {n}"] = r.get(evil_out)
        # Rung again without a rewrite of the header: the garbage now in the area is what
        # the driver reads, copies and refuses; the good request is served again after it.
        layout.write_request_header(r.buf, r.seq, 200)
        out["garbage"] = r.status(None, 200)
        # (Answered in full or SAME: a refused request need not drop the kept one.)
        r.fill(out_at)
        out["good again"] = r.status(good), r.get(out_at)
        return out


def test_a_request_rewritten_after_the_check_runs_as_checked(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True, driver=ONE_CHANNEL)
    rt = str(runtime_dir)
    app = procs.spawn_as(ATTACKER, None, rewrite_after_the_check, rt, timeout=120)
    try:
        for _ in range(3):
            app.expect("hogging", 60)
            wait_until(lambda: driver_load(rt)["busy"] == 1, 30, "the hog on the channel")
            app.send("ring")
            app.expect("rung", 30)
            wait_until(lambda: driver_load(rt)["queued"] == 1, 30, "the burst's job queued")
            app.send("rewrite")
        out = app.wait(60)
    finally:
        app.kill()
    assert [out[f"hog {n}"] for n in range(3)] == ["WorkCancelled"] * 3, out
    # Parsed afresh: the full answer of the request checked; then the kept one, answered
    # in full or SAME, and it ran (the new input in its slot gave new outputs where the
    # checked request said).
    assert settled([out[f"answer {n}"] for n in range(3)]), out
    assert [out[f"out {n}"] for n in range(3)] == [[1.0, 2.0, 3.0, 4.0], [1.0, 3.0, 5.0, 7.0],
                                                   [1.0, 4.0, 7.0, 10.0]], out
    assert [out[f"evil out {n}"] for n in range(3)] == [UNTOUCHED] * 3, out
    assert out["garbage"] == "InvalidArgument", out
    status, ran = out["good again"]
    assert status in ("OK", "SAME") and ran == [1.0, 4.0, 7.0, 10.0], out
    assert_device_served(runtime_dir)


def same_misused(rt: str) -> dict[str, Any]:
    """FLAG_SAME set (as the client runtime does): which requests the driver answers SAME,
    and whether each one ran (the outputs follow the inputs)."""
    with granted(rt) as (dev, grant):
        rpc = dev.connection()
        model = dev.prepare_model(add_model(), grant=grant)
        other = dev.prepare_model(add_model(4, 10.0), grant=grant)
        r = Raw(model.burst())
        got: dict[str, Any] = {"flags": layout.read_client_flags(r.buf)}
        inp = register_pool(dev, rpc)
        inp.buf[0:16] = X.tobytes()
        out_at = r.slot(1)
        k = r.request(0, out_at, x_pool=inp.pool_id)
        got["k"] = [r.status(k) for _ in range(3)]
        inp.buf[0:16] = (X * 2).tobytes()
        got["repeat"] = r.status(k)
        got["repeat out"] = r.get(out_at)
        got["another request"] = r.status(r.request(0, r.slot(2), x_pool=inp.pool_id))
        got["back"] = [r.status(k) for _ in range(3)]  # the last full answer: the other's
        got["other priority"] = r.status(r.request(0, out_at, x_pool=inp.pool_id,
                                                   job_priority=7))
        got["back after it"] = r.status(k)
        # The kept request's input pool goes: its repeat names a pool that is not there.
        dev.call(rpc, "device.unregister_pool", pb.PoolId(pool_id=inp.pool_id))
        r.fill(out_at)
        got["pool gone"] = r.status(k)
        got["pool gone out"] = r.get(out_at)
        # Another pool, its own id: answered in full again, then SAME.
        inp2 = register_pool(dev, rpc)
        inp2.buf[0:16] = X.tobytes()
        k2 = r.request(0, out_at, x_pool=inp2.pool_id)
        got["new pool"] = [r.status(k2) for _ in range(3)]
        # A burst of another model sent the very bytes this one kept (its outputs into
        # this burst's memory, the same connection's): a first execution of its own.
        r2 = Raw(other.burst())
        got["other burst"] = [r2.status(k2) for _ in range(3)]
        got["other burst out"] = r.get(out_at)  # y = x + 10
        got["this burst"] = r.status(k2)  # its own last full answer was k2's: it runs
        got["this burst out"] = r.get(out_at)
        return got


def test_same_answers_only_a_repeat_of_the_last_full_answer_and_it_always_runs(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True)
    got = procs.run_as(ATTACKER, None, same_misused, str(runtime_dir), timeout=60)
    assert got["flags"] & layout.FLAG_SAME, got
    assert settled(got["k"]), got  # never SAME before a full answer
    assert got["repeat"] == "SAME" and got["repeat out"] == [1.0, 3.0, 5.0, 7.0], got
    assert got["another request"] == "OK", got
    assert settled(got["back"]), got
    assert (got["other priority"], got["back after it"]) == ("OK", "OK"), got
    assert got["pool gone"] == "InvalidArgument", got
    assert got["pool gone out"] == UNTOUCHED, got
    assert settled(got["new pool"]), got
    assert settled(got["other burst"]), got
    assert got["other burst out"] == [10.0, 11.0, 12.0, 13.0], got
    assert got["this burst"] == "SAME" and got["this burst out"] == [1.0, 2.0, 3.0, 4.0], got
    assert_device_served(runtime_dir)


def burst_after_its_model(rt: str, how: str) -> dict[str, Any]:
    """A burst's kept request (answered SAME), then its model released by a raw call (the
    burst left open) or its grant ended (npud revokes the model in the driver): what the
    burst's executions get, and whether they wrote their outputs."""
    with NpuManager(rt, client_name="app") as mgr:
        req = ModelLoadRequest(id=1)
        cb = Lifecycle()
        mgr.request_can_load_model(req, cb)
        cb.wait_for("CAN_LOAD_NOW")
        dev = nn.device("reference", rt)
        model = dev.prepare_model(add_model(), grant=cb.listener)
        r = Raw(model.burst())
        x_at, out_at = r.slot(0), r.slot(1)
        r.put(x_at, X)
        k = r.request(x_at, out_at)
        got: dict[str, Any] = {"before": [r.status(k) for _ in range(3)]}
        if how == "release":
            dev.call(model._rpc, "device.release", pb.Release(model_id=model.model_id))
        else:
            cb.listener.notify_model_unloaded(req)
            cb.wait_for("COMPLETE")
            # npud answers COMPLETE only once the driver acknowledged the end of the grant
            # (service/ending.py): the very first ring after COMPLETE is refused.
            got["first after complete"] = r.call(k)
        r.fill(out_at)
        got["after"] = [r.call(k), r.call(k), r.status(r.request(x_at, out_at, steps=3))]
        got["out"] = r.get(out_at)
        got["garbage"] = r.status(b"\xff" * 64)  # the burst answers on, typed
        got["another burst"] = outcome(lambda: model.burst().execute({"x": X}))
        dev.close()
        return got


def test_a_burst_of_a_released_model_gets_typed_errors_and_never_runs(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True)
    got = procs.run_as(ATTACKER, None, burst_after_its_model, str(runtime_dir), "release",
                       timeout=60)
    assert settled(got["before"]), got
    assert [a[0] for a in got["after"][:2]] == ["InvalidArgument"] * 2, got
    assert got["after"][2] == "InvalidArgument", got
    assert got["out"] == UNTOUCHED, got
    assert got["garbage"] == "InvalidArgument", got
    assert got["another burst"].startswith("InvalidArgument"), got
    assert_device_served(runtime_dir)


def test_a_burst_of_a_revoked_model_gets_grant_revoked_and_never_runs(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True)
    got = procs.run_as(ATTACKER, None, burst_after_its_model, str(runtime_dir), "revoke",
                       timeout=60)
    assert settled(got["before"]), got
    assert got["first after complete"][0] == "GrantRevoked", got
    assert [a[0] for a in got["after"][:2]] == ["GrantRevoked"] * 2, got
    assert got["after"][2] == "GrantRevoked", got
    assert got["out"] == UNTOUCHED, got
    assert got["garbage"] == "InvalidArgument", got
    # A new burst on it is refused at once, as an execution of it is: GrantRevoked saying
    # why, in the same words (open_burst said InvalidArgument "no prepared model").
    assert got["another burst"] == f"GrantRevoked: {got['after'][0][1]}", got
    assert_device_served(runtime_dir)
