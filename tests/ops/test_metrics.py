"""Prometheus metrics scraped from a real npud with the reference driver while client apps
run, parsed with prometheus_client's own parser."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from npumanager import (
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelSize,
    NpuManager,
    nn,
)
from npumanager.errors import InvalidArgument
from npumanager.service.metrics import parse_listen
from npumanager.testing.daemon import DaemonProcess, driver_hosts
from npumanager.testing.onnx_models import matmul_model
from tests.security.harness import Lifecycle

pytestmark = pytest.mark.slow

#: API.md "Operations": every sample name npud exports.
API_NAMES = {
    "npu_requests", "npu_budget_used", "npu_budget_max", "npu_grants_total",
    "npu_unload_requests_total", "npu_requests_completed_total",
    "npu_grant_latency_seconds_bucket", "npu_grant_latency_seconds_count",
    "npu_grant_latency_seconds_sum", "npu_thermal_status", "npu_thermal_headroom",
    "npu_driver_up", "npu_work_total", "npu_work_seconds_bucket", "npu_work_seconds_count",
    "npu_work_seconds_sum", "npu_cache_loads_total", "npu_requests_dropped_total",
}


@pytest.fixture
def npud(runtime_dir: Path, state_dir: Path) -> Iterator[DaemonProcess]:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    with DaemonProcess(runtime_dir, {"manager": {"unload_deadline_s": 30.0}}, drivers=True,
                       env=env, ready_timeout=60,
                       extra_args=["--metrics", "127.0.0.1:0"]) as d:
        yield d


def scrape(npud: DaemonProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    assert npud.ready_line is not None
    m = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", npud.ready_line)
    assert m, npud.ready_line
    with urllib.request.urlopen(m.group(1), timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_created"):
                continue
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


class Granted(ModelLoadRequestCallback):
    def __init__(self) -> None:
        self.listener: Any = None
        self.event = threading.Event()

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        if status == LoadStatus.CAN_LOAD_NOW:
            self.listener = listener
            self.event.set()


def test_listen_address() -> None:
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("[::1]:0") == ("::1", 0)
    assert parse_listen(":9464") == ("0.0.0.0", 9464)
    for bad in ("9464", "host:", "h:99999", "h:x"):
        with pytest.raises(InvalidArgument):
            parse_listen(bad)


def test_a_port_in_use_stops_serve_in_one_line(runtime_dir: Path) -> None:
    """npud ran on with a 20-line traceback in its log, no endpoint, and a ready line
    naming the other process's port as its metrics; now `npu serve` refuses at once."""
    import socket

    npu = Path(sys.executable).with_name("npu")
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = subprocess.run([str(npu), "serve", "--runtime-dir", str(runtime_dir),
                               "--no-drivers", "--metrics", f"127.0.0.1:{port}"],
                              capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and "ready" not in proc.stdout, proc.stdout
    errors = [ln for ln in proc.stderr.splitlines() if "npumanager.npud" not in ln]
    assert errors == [f"npu serve: InvalidArgument: metrics listen address '127.0.0.1:{port}':"
                      f" port {port} is in use (another process listens on it): stop it, or "
                      "choose another port (port 0 picks a free one)"], proc.stderr


def test_scrape_during_a_real_workload(npud: DaemonProcess, tmp_path: Path) -> None:
    rt = npud.runtime_dir
    before = scrape(npud)
    assert {name for name, _ in before} >= API_NAMES - {
        "npu_unload_requests_total", "npu_work_total", "npu_work_seconds_bucket",
        "npu_work_seconds_count", "npu_work_seconds_sum", "npu_cache_loads_total"}
    assert value(before, "npu_driver_up", driver="reference") == 1.0
    assert value(before, "npu_budget_max", device="reference") == 4.0

    onnx = matmul_model(dim=64, depth=2, batch=4)
    token = bytes(range(32))
    cache = tmp_path / "cache"
    cache.mkdir()
    x = {"x": np.ones((4, 64), np.float32)}
    with NpuManager(rt) as mgr, nn.device("reference", rt) as dev:
        for rid, size in ((1, ModelSize.GREATER_THAN_2G), (2, ModelSize.LESS_THAN_1GB)):
            cb = Granted()
            req = ModelLoadRequest(rid, size)
            mgr.request_can_load_model(req, cb)
            if rid == 1:
                assert cb.event.wait(10)
                # miss (compiled, cache written), then hit from the same files
                for expect_cached in (False, True):
                    model = dev.prepare_model(onnx, grant=cb.listener, cache_dir=cache,
                                              token=token)
                    assert model.loaded_from_cache is expect_cached
                    model.execute(x)
                    if not expect_cached:
                        model.release()
                cb.listener.notify_model_loaded(req)
                held = (req, cb, model)
        waiting = cb  # request 2's
        # Request 2 waits behind the >2GB holder; another app runs meanwhile.
        app = subprocess.run([str(Path(sys.executable).with_name("npu")), "run", "--builtin",
                              "add", "--repeat", "3", "--wait", "0.5", "--runtime-dir",
                              str(rt)], capture_output=True, text=True, timeout=60)
        assert app.returncode == 1 and "within 0.5 s" in app.stderr  # it had to wait
        during = scrape(npud)
        assert value(during, "npu_requests", device="reference", state="loaded") == 1.0
        assert value(during, "npu_requests", device="reference", state="waiting") == 1.0
        assert value(during, "npu_budget_used", device="reference") == 4.0
        assert value(during, "npu_cache_loads_total", driver="reference", result="miss") == 1
        assert value(during, "npu_cache_loads_total", driver="reference", result="hit") == 1
        # A tampered cache file is rejected (then compiled again: a miss).
        req, cb, model = held
        model.release()
        files = sorted(p for p in cache.iterdir() if p.is_file())
        data = bytearray(files[0].read_bytes())
        data[len(data) // 2] ^= 0xFF
        files[0].write_bytes(bytes(data))
        again = dev.prepare_model(onnx, grant=cb.listener, cache_dir=cache, token=token)
        assert not again.loaded_from_cache
        again.release()
        cb.listener.notify_model_unloaded(req)
        # npud grants request 2 once the driver has acknowledged the end of request 1's
        # grant, and answers its cancellation once the driver has acknowledged that end too
        # (counted when decided: test_a_request_whose_client_left_before_the_drivers_ack_...).
        assert waiting.event.wait(30)
        mgr.cancel_model_load(ModelLoadRequest(2))
        deadline = time.monotonic() + 30
        while (value(scrape(npud), "npu_requests_completed_total", device="reference",
                     status="cancelled") < 2 and time.monotonic() < deadline):
            time.sleep(0.05)
    # The workload is over: what happened is in the counters.
    after = scrape(npud)
    assert {name for name, _ in after} >= API_NAMES
    assert value(after, "npu_cache_loads_total", driver="reference", result="rejected") == 1
    assert value(after, "npu_cache_loads_total", driver="reference", result="miss") == 2
    assert value(after, "npu_grants_total", device="reference") >= 2
    assert value(after, "npu_requests_completed_total", device="reference",
                 status="complete") >= 1
    assert value(after, "npu_requests_completed_total", device="reference",
                 status="cancelled") >= 2
    assert value(after, "npu_grant_latency_seconds_count") >= 2
    assert value(after, "npu_work_total", device="reference", end_reason="completed") >= 1
    assert value(after, "npu_work_seconds_count", device="reference") >= 1
    assert value(after, "npu_requests", device="reference", state="loaded") == 0.0
    assert value(after, "npu_thermal_status") == 0.0


def test_grafana_dashboard_uses_exported_names() -> None:
    import json

    doc = json.loads((Path(__file__).resolve().parents[2] / "packaging/grafana/npu.json")
                     .read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    used = set(re.findall(r"\bnpu_[a-z_]+", " ".join(exprs)))
    # (npu_grant_moves_total: README's addition beyond API.md's list)
    extra = {"npu_grant_latency_seconds_bucket", "npu_grant_moves_total"}
    assert used <= API_NAMES | extra, used - API_NAMES - extra
    bases = {n.removesuffix("_bucket") for n in used}
    for family in ("npu_requests", "npu_budget_used", "npu_budget_max", "npu_grants_total",
                   "npu_unload_requests_total", "npu_requests_completed_total",
                   "npu_grant_latency_seconds", "npu_thermal_status", "npu_thermal_headroom",
                   "npu_driver_up", "npu_work_total", "npu_work_seconds",
                   "npu_cache_loads_total", "npu_requests_dropped_total",
                   "npu_grant_moves_total"):
        assert family in bases, family


def test_a_request_whose_client_left_before_the_drivers_ack_is_counted(
        runtime_dir: Path, state_dir: Path) -> None:
    """The driver is stopped (SIGSTOP: it acknowledges nothing), the app reports unloaded
    and leaves; npud's answer, waiting for the ack, never goes out. The request still counts,
    once: at the decision, and not again when the driver's ack arrives after SIGCONT."""
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    # No restart for a missing ack during the test, however loaded the machine.
    cfg = {"manager": {"grant_end_ack_s": 600.0}}
    with DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60,
                       extra_args=["--metrics", "127.0.0.1:0"]) as npud:
        before = value(scrape(npud), "npu_requests_completed_total", device="reference",
                       status="complete")
        [host] = driver_hosts(runtime_dir)
        with NpuManager(runtime_dir, client_name="watcher") as watcher:
            mgr = NpuManager(runtime_dir, client_name="app")
            req = ModelLoadRequest(id=1)
            cb = Lifecycle()
            mgr.request_can_load_model(req, cb)
            cb.wait_for("CAN_LOAD_NOW", 60)
            os.kill(host, signal.SIGSTOP)
            try:
                cb.listener.notify_model_unloaded(req)
                ending = wait_for(lambda: watcher.dump()["ending"], 60)
                assert [(e["uid"], e["request_id"], e["answer"]) for e in ending] == [
                    (os.getuid(), 1, "COMPLETE")]
                mid = value(scrape(npud), "npu_requests_completed_total", device="reference",
                            status="complete")
                assert mid == before + 1  # counted when decided, before any answer
                mgr.close()  # the client leaves: nobody is left to answer
                wait_for(lambda: [e for e in watcher.dump()["ending"]
                                  if e["answer"] is None], 60)
                assert "COMPLETE" not in cb.seen
            finally:
                os.kill(host, signal.SIGCONT)
                mgr.close()  # (closed already, unless the test failed before)
            wait_for(lambda: watcher.dump()["ending"] == [], 60)  # the driver's ack came
            after = scrape(npud)
        assert value(after, "npu_requests_completed_total", device="reference",
                     status="complete") == before + 1  # and not counted twice


def wait_for(probe: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got or time.monotonic() > deadline:
            assert got, f"not seen within {timeout} s"
            return got
        time.sleep(0.05)


def test_a_background_lane_is_a_driver_up_row_of_its_own(runtime_dir: Path,
                                                          state_dir: Path) -> None:
    """[[driver]] background_host: npu_driver_up{driver="NAME.background"} for the
    device's second host process, beside the device's own row (its main host)."""
    import signal

    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    cfg = {"driver": [{"name": "reference", "plugin": "reference", "background_host": True,
                       "restart_backoff_s": 5.0}]}
    with DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60,
                       extra_args=["--metrics", "127.0.0.1:0"]) as d, \
            NpuManager(runtime_dir) as mgr:
        samples = scrape(d)
        assert value(samples, "npu_driver_up", driver="reference") == 1.0
        assert value(samples, "npu_driver_up", driver="reference.background") == 1.0
        os.kill(mgr.dump()["devices"][0]["hosts"]["background"]["pid"], signal.SIGKILL)
        samples = wait_for(lambda: (s := scrape(d)) and value(
            s, "npu_driver_up", driver="reference.background") == 0.0 and s, 30)
        assert value(samples, "npu_driver_up", driver="reference") == 1.0  # the device's
