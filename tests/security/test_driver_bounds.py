"""Attack 6: unbounded holdings in a driver. There was no bound on shared-memory pools
(20k pools until the driver's fd limit), and a sparse 1 GiB model memfd cost the attacker
nothing and the driver 1 GiB of memory each.

Now the driver bounds what each uid (and connection) makes it hold: pools and their bytes,
bytes being read for prepares, prepared models, queued and running executions. Bytes count
as the driver sees them: a memfd by its size, however sparse. A uid at a bound gets
LimitExceeded at once, before the driver reads or maps anything more; another uid is
served as before."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from npumanager import tensorio
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.testing import procs
from npumanager.testing.onnx_models import add_model, step_model
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import granted, outcome, wait_until
from tests.security.harness import ATTACKER, assert_device_served, needs_root
from tests.security.test_endless_jobs import ONE_CHANNEL, driver_load

pytestmark = needs_root

GiB = 1 << 30


def hog_pools(runtime_dir: str, sizes: list[int]) -> list[str]:
    """Register one pool (a sealed memfd, sparse: it costs us nothing) per size."""
    out = []
    pools = []
    with granted(runtime_dir) as (dev, _grant):
        rpc = dev.connection()
        for size in sizes:
            pool = tensorio.ClientPool(size)
            pools.append(pool)
            out.append(outcome(lambda p=pool: pb.PoolId.FromString(dev.call(
                rpc, "device.register_pool", pb.RegisterPool(size=p.size), fds=[p.fd])[0]
            ).pool_id))
    for pool in pools:
        pool.close()
    return out


def test_pools_per_uid_are_bounded_in_count(start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True, manager={"max_pools_per_uid": 4})
    got = procs.run_as(ATTACKER, None, hog_pools, str(runtime_dir), [1 << 20] * 6)
    assert [g.split(":")[0] for g in got] == ["ok"] * 4 + ["LimitExceeded"] * 2, got
    assert got[4] == ("LimitExceeded: uid 50001 already has 4 shared-memory pools on driver "
                      "reference (the bound is 4)")
    assert_device_served(runtime_dir)


def test_sparse_pools_count_by_their_size(start_npud: StartDaemon,
                                          runtime_dir: Path) -> None:
    start_npud(drivers=True, manager={"max_pool_bytes_per_uid": 2 * GiB})
    got = procs.run_as(ATTACKER, None, hog_pools, str(runtime_dir), [GiB] * 3)
    assert [g.split(":")[0] for g in got] == ["ok", "ok", "LimitExceeded"], got
    assert got[2] == ("LimitExceeded: uid 50001 has 2 GiB of shared-memory pools on driver "
                      "reference; 1 GiB more would pass the bound of 2 GiB")
    assert_device_served(runtime_dir)


def sparse_model_memfd(runtime_dir: str, size: int) -> str:
    """A prepare whose model memfd is ``size`` bytes of nothing (sparse, free to make)."""
    with granted(runtime_dir) as (dev, grant):
        memfd = os.memfd_create("npu-model", os.MFD_CLOEXEC)
        try:
            os.ftruncate(memfd, size)
            msg = pb.PrepareModel(grant_id=grant.grant_id, preference=1, priority=100,
                                  onnx_in_memfd=True, onnx_size=size)
            return outcome(lambda: dev.call(dev.connection(), "device.prepare_model", msg,
                                            fds=[memfd]))
        finally:
            os.close(memfd)


def test_model_bytes_being_read_are_bounded_by_the_memfds_size(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True, manager={"max_prepare_bytes_per_uid": 512 << 20})
    got = procs.run_as(ATTACKER, None, sparse_model_memfd, str(runtime_dir), GiB)
    assert got == ("LimitExceeded: uid 50001 has 0 bytes of models being read for prepares "
                   "on driver reference; 1 GiB more would pass the bound of 512 MiB"), got
    assert_device_served(runtime_dir)


def hog_models(runtime_dir: str, n: int) -> list[str]:
    out = []
    models = []
    with granted(runtime_dir) as (dev, grant):
        for i in range(n):
            def prep(i: int = i) -> str:
                models.append(dev.prepare_model(add_model(4, float(i)), grant=grant))
                return "prepared"
            out.append(outcome(prep))
        for m in models:
            m.release()
    return out


def test_prepared_models_per_uid_are_bounded(start_npud: StartDaemon,
                                             runtime_dir: Path) -> None:
    start_npud(drivers=True, manager={"max_models_per_uid": 2})
    got = procs.run_as(ATTACKER, None, hog_models, str(runtime_dir), 3, timeout=60)
    assert got[:2] == ["ok: prepared"] * 2, got
    assert got[2] == ("LimitExceeded: uid 50001 already has 2 models (prepared or being "
                      "prepared) on driver reference (the bound is 2)"), got
    assert_device_served(runtime_dir)


def hog_jobs(runtime_dir: str, n: int) -> dict[str, Any]:
    """``n`` endless jobs at once, then one more; then cancel them all."""
    with granted(runtime_dir) as (dev, grant):
        model = dev.prepare_model(step_model(4, work_dim=64), grant=grant)
        results: list[str] = []

        def run() -> None:
            results.append(outcome(lambda: model.execute(
                {"state": np.zeros((1, 4), np.float32)}, steps=1_000_000,
                feedback={"state_out": "state"})))

        threads = [threading.Thread(target=run) for _ in range(n)]
        for t in threads:
            t.start()
        procs.receive(timeout=60)  # all of them live: the test checked
        run()  # one more
        extra = results.pop()
        model.cancel()
        for t in threads:
            t.join(30)
        model.release()
        return {"extra": extra, "jobs": results}


def test_queued_and_running_jobs_per_uid_are_bounded(start_npud: StartDaemon,
                                                     runtime_dir: Path) -> None:
    start_npud(drivers=True, driver=ONE_CHANNEL, manager={"max_jobs_per_uid": 3})
    hog = procs.spawn_as(ATTACKER, None, hog_jobs, str(runtime_dir), 3, timeout=120)
    try:
        wait_until(lambda: (lambda s: s["busy"] + s["queued"] == 3)(driver_load(runtime_dir)),
                   30, "the attacker's three jobs", lambda: driver_load(runtime_dir))
        assert_device_served(runtime_dir)  # the bystander's own bound is untouched
        hog.send("go on")
        out = hog.wait()
    finally:
        hog.kill()
    assert out["extra"] == ("LimitExceeded: uid 50001 already has 3 executions queued or "
                            "running on driver reference (the bound is 3)"), out
    assert all(j.startswith("WorkCancelled") for j in out["jobs"]), out
    assert_device_served(runtime_dir)
