"""Traces: a recording turned into Chrome trace-event JSON and a picture (synthetic data),
and `npu trace record` against a real npud and driver while apps run."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import (
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelPriority,
    NpuManager,
    ThermalStatus,
    nn,
)
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.onnx_models import add_model
from npumanager.trace.chrome import request_spans, summarize, to_chrome
from npumanager.trace.recorder import Recording, TraceRecorder
from tests.cli.conftest import npu

T0 = 1000.0


@pytest.fixture
def npud_drivers(runtime_dir: Path, state_dir: Path) -> Iterator[DaemonProcess]:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    with DaemonProcess(runtime_dir, drivers=True, env=env, ready_timeout=60) as d:
        yield d


def synthetic() -> Recording:
    """uid 5 loads, is preempted and complies; uid 6 is granted, ignores a THERMAL unload
    and is revoked; three steps on two channels; thermal rises to SEVERE."""
    d = lambda at, what, **details: {"at": T0 + at, "what": what,  # noqa: E731
                                     "stimulus_id": "x", "details": details}
    rec = Recording(t0=T0, t1=T0 + 10.0)
    rec.stories = {
        "5:1": [d(1.0, "requested"), d(1.0, "granted"), d(1.5, "loaded"),
                d(4.0, "asked to unload", reason="PREEMPTED"), d(4.5, "complete")],
        "6:2": [d(3.0, "requested"), d(3.0, "wait_for_unload"), d(4.5, "granted"),
                d(5.0, "loaded"), d(6.0, "asked to unload", reason="THERMAL"),
                d(7.0, "unload deadline passed"), d(7.0, "revoked")],
    }
    rec.steps = {"reference": [
        {"channel": 0, "start": T0 + 2.0, "dur": 0.010, "uid": 5, "feature": None, "job": 1,
         "step": 0},
        {"channel": 1, "start": T0 + 2.005, "dur": 0.002, "uid": 5, "feature": 3, "job": 2,
         "step": 0},
        {"channel": 0, "start": T0 + 5.5, "dur": 0.004, "uid": 6, "feature": None, "job": 3,
         "step": 1},
    ]}
    rec.channels = {"reference": 2}
    rec.samples = [(T0 + 0.5, 0, 4, 0), (T0 + 2.0, 4, 4, 0), (T0 + 6.0, 1, 2, 3)]
    rec.uid_names = {"5": "camera"}
    return rec


def test_spans_and_marks_follow_npuds_decisions() -> None:
    spans, marks = request_spans(synthetic())
    got = [(s.uid, s.state, s.start, s.end) for s in spans]
    assert got == [(5, "granted", 1.0, 1.5), (5, "loaded", 1.5, 4.0),
                   (5, "unload_requested", 4.0, 4.5), (6, "waiting", 3.0, 4.5),
                   (6, "granted", 4.5, 5.0), (6, "loaded", 5.0, 6.0),
                   (6, "unload_requested", 6.0, 7.0)]
    assert [(m.uid, m.what, m.at, m.reason) for m in marks] == [
        (5, "grant", 1.0, ""), (5, "unload asked", 4.0, "PREEMPTED"), (6, "grant", 4.5, ""),
        (6, "unload asked", 6.0, "THERMAL"), (6, "unload deadline passed", 7.0, ""),
        (6, "revoked", 7.0, "")]


def test_chrome_trace_has_the_api_tracks() -> None:
    doc = json.loads(json.dumps(to_chrome(synthetic())))  # JSON-able
    ev = doc["traceEvents"]
    names = {(e["ph"], e["name"]) for e in ev}
    threads = {e["args"]["name"] for e in ev if e["name"] == "thread_name"}
    assert {"camera", "uid 6", "channel 0", "channel 1"} <= threads
    procs = {e["args"]["name"] for e in ev if e["name"] == "process_name"}
    assert procs == {"npud", "device reference"}
    assert {("i", "grant"), ("i", "unload asked (PREEMPTED)"), ("i", "unload asked (THERMAL)"),
            ("i", "revoked"), ("C", "budget used"), ("C", "thermal status")} <= names
    steps = [e for e in ev if e.get("cat") == "execution"]
    assert [(e["tid"], e["ts"], e["dur"], e["name"]) for e in steps] == [
        (1, 2_000_000.0, 10_000.0, "camera"), (2, 2_005_000.0, 2_000.0, "camera · feature 3"),
        (1, 5_500_000.0, 4_000.0, "uid 6")]
    loaded = [e for e in ev if e.get("cat") == "request" and e["args"]["state"] == "loaded"]
    assert [(e["tid"], e["ts"], e["dur"]) for e in loaded] == [
        (5, 1_500_000.0, 2_500_000.0), (6, 5_000_000.0, 1_000_000.0)]
    for e in ev:  # every event Perfetto's JSON importer needs
        assert "ph" in e and "pid" in e and "name" in e
        if e["ph"] in ("X", "i", "C"):
            assert isinstance(e["ts"], float)


def test_summary_counts() -> None:
    s = summarize(synthetic())
    assert s["apps"]["camera"]["unload_asks"] == {"PREEMPTED": 1}
    assert s["apps"]["camera"]["execution_steps"] == 2
    assert s["apps"]["6"]["revoked"] == 1 and s["apps"]["6"]["grants"] == 1
    assert s["thermal_peak"] == "SEVERE" and s["budget_peak"] == 4 and s["steps"] == 3


def test_timeline_picture(tmp_path: Path) -> None:
    import matplotlib.image

    from npumanager.trace.timeline import draw

    path = draw(synthetic(), tmp_path / "t.png")
    img = matplotlib.image.imread(str(path))
    assert img.shape[0] > 300 and img.shape[1] > 1000
    # Not blank: the state colours are there.
    assert len(np.unique(img.reshape(-1, img.shape[2]), axis=0)) > 20


class Hold(ModelLoadRequestCallback):
    def __init__(self) -> None:
        self.listener: Any = None
        self.granted = threading.Event()
        self.asked = threading.Event()

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        if status == LoadStatus.CAN_LOAD_NOW:
            self.listener = listener
            self.granted.set()

    def on_request_unload_model(self, request: Any, reason: Any) -> None:
        self.asked.set()


@pytest.mark.slow
def test_trace_record_against_a_real_npud(npud_drivers: DaemonProcess, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    rt = npud_drivers.runtime_dir
    out, png, summ = tmp_path / "t.json", tmp_path / "t.png", tmp_path / "s.json"
    result: dict[str, Any] = {}
    # The recorder says when it has started: connected to npud, its clock running and the
    # drivers' step recording on (start() polls device.trace before it returns).
    started = threading.Event()
    recorders: list[TraceRecorder] = []
    real_start = TraceRecorder.start

    def start(self: TraceRecorder) -> TraceRecorder:
        recorder = real_start(self)
        recorders.append(recorder)
        started.set()
        return recorder

    monkeypatch.setattr(TraceRecorder, "start", start)
    # The recorder learns which requests exist by polling npud's dump (every 50 ms): the
    # workload goes on once a poll has seen the request, however slow the machine.
    seen_request = threading.Event()
    real_poll = TraceRecorder.poll

    def poll(self: TraceRecorder) -> None:
        real_poll(self)
        if self._keys:
            seen_request.set()

    monkeypatch.setattr(TraceRecorder, "poll", poll)

    # The recording lasts until the workload is done (as Ctrl-C ends it), not a fixed 3 s
    # that a loaded machine's prepare and 40 executions overran (18 of 40 steps recorded);
    # --duration only bounds it.
    def record() -> None:
        result["rc"] = npu(capsys, "trace", "record", "--duration", "120", "-o", str(out),
                           "--png", str(png), "--summary", str(summ), "--runtime-dir", str(rt))

    t = threading.Thread(target=record)
    t.start()
    with NpuManager(rt) as mgr, nn.device("reference", rt) as dev:
        # Start the workload once the recorder has started.
        assert started.wait(60), "the recorder never started"
        cb = Hold()
        req = ModelLoadRequest(9, priority=ModelPriority.BACKGROUND)
        mgr.request_can_load_model(req, cb)
        assert cb.granted.wait(60)
        assert seen_request.wait(60), "the recorder never saw the request"
        model = dev.prepare_model(add_model(), grant=cb.listener)
        cb.listener.notify_model_loaded(req)
        for _ in range(40):
            model.execute({"x": np.ones((1, 4), np.float32)}, feature_id=7)
        mgr.override_thermal_status(ThermalStatus.SEVERE)  # a BACKGROUND holder must leave
        assert cb.asked.wait(60)
        model.release()
        cb.listener.notify_model_unloaded(req)
        # SEVERE stays on until the recording has ended: its last poll sees it.
        recorders[0]._stop.set()
        t.join(60)
        assert not t.is_alive(), "the recording did not end"
        mgr.reset_thermal_status()
    rc, stdout, err = result["rc"]
    assert rc == 0, err
    assert f"wrote {out}: 1 request, 40 execution steps" in stdout
    ev = json.loads(out.read_text())["traceEvents"]
    uid = os.getuid()
    steps = [e for e in ev if e.get("cat") == "execution"]
    assert len(steps) == 40 and all(e["name"] == f"uid {uid} · feature 7" for e in steps)
    assert {e["ph"] + ":" + e["name"] for e in ev if e["ph"] == "i"} >= {
        "i:grant", "i:unload asked (THERMAL)"}
    states = [e["args"]["state"] for e in ev if e.get("cat") == "request"]
    assert states[:3] == ["granted", "loaded", "unload_requested"]
    # The steps ran while the request was loaded, on npud's clock.
    loaded = next(e for e in ev if e.get("cat") == "request" and e["args"]["state"] == "loaded")
    assert all(loaded["ts"] <= e["ts"] <= loaded["ts"] + loaded["dur"] for e in steps)
    assert max(e["args"]["status"] for e in ev if e["name"] == "thermal status") == 3
    s = json.loads(summ.read_text())
    assert s["apps"][str(uid)]["unload_asks"] == {"THERMAL": 1}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trace_needs_admin_is_clear(runtime_dir: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = npu(capsys, "trace", "record", "--runtime-dir", str(runtime_dir))
    assert rc == 1 and "is `npu serve` running?" in err
    rc, _, err = npu(capsys, "trace", "record", "--duration", "0")
    assert rc == 2
