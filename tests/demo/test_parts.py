"""The demo's parts on their own: models, output, event log, HAL observer, app processes."""

from __future__ import annotations

import io
import os
import threading
from typing import Any

import numpy as np
import pytest

from npumanager.demo.models import camera_model, llm_step_model, mlp_model
from npumanager.demo.observe import EventLog, HalObserver
from npumanager.demo.process import AppProcess, LineQueue, Outbox
from npumanager.demo.render import Renderer, fmt_ms, percentile
from npumanager.demo.summary import status_excerpt
from npumanager.hal.types import EndReason, StartReason, WorkInfo


def _run(onnx: bytes, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    sess = ort.InferenceSession(onnx, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs), strict=True))


def test_llm_step_model_advances_position_and_is_a_real_dense_stack() -> None:
    m = llm_step_model(dim=32, layers=2)
    out = _run(m.onnx, m.inputs)
    assert out["pos_out"].tolist() == [[1.0]]
    assert out["h_out"].shape == (1, 32)
    assert np.all(np.abs(out["h_out"]) < 1.0)  # tanh
    assert not np.allclose(out["h_out"], np.tanh(m.inputs["h"]))  # the weights did something
    assert m.feedback == {"h_out": "h", "pos_out": "pos"}


def test_camera_and_mlp_models_run_on_their_inputs() -> None:
    cam = camera_model(size=32)
    assert _run(cam.onnx, cam.inputs)["scores"].shape == (1, 10)
    mlp = mlp_model("m", 16, 2, 4, seed=0)
    assert _run(mlp.onnx, mlp.inputs)["y"].shape == (4, 16)


def test_renderer_without_a_terminal_prints_plain_text() -> None:
    buf = io.StringIO()
    out = Renderer(stream=buf)
    out.title("npumanager demo", "sub")
    out.scene(1, 6, "A scene", "why")
    out.event("camera", "CAN_LOAD_NOW", style="green")
    out.table("T", ["phase", "p50"], [["alone", fmt_ms(2.04)]], caption="cap")
    text = buf.getvalue()
    assert "\x1b[" not in text
    assert "--- [1/6] A scene" in text
    assert "camera   CAN_LOAD_NOW" in text
    assert "| alone | 2.0 ms |" in text


def test_percentile_and_fmt_ms() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(list(map(float, range(101))), 99) == 99.0
    assert fmt_ms(None) == "-"
    assert fmt_ms(250.4) == "250 ms"


def test_event_log_waits_for_a_matching_event() -> None:
    log = EventLog()
    seen: list[dict[str, Any]] = []
    log.listeners.append(seen.append)
    threading.Timer(0.02, log.add, [{"app": "llm", "ev": "unload_asked", "t": 5.0,
                                     "reason": "THERMAL"}]).start()
    got = log.wait("llm", "unload_asked", 5.0, pred=lambda e: e["reason"] == "THERMAL")
    assert got is not None and got["t"] == 5.0
    assert log.wait("llm", "unload_asked", 0.0, after=6.0) is None
    assert log.find(ev="unload_asked") == seen


def _info(work_id: int, uid: int) -> WorkInfo:
    return WorkInfo(id=work_id, group_id=None, uid=uid, debug_pid=1, original_uid=uid,
                    debug_feature_id=None, job_priority=0, effective_priority=400,
                    timestamp_ms=0)


def test_hal_observer_pairs_a_pause_with_its_resume() -> None:
    obs = HalObserver()
    obs.on_work_started(_info(7, 61004), StartReason.INITIAL)
    obs.on_work_ended(_info(7, 61004), EndReason.PAUSED)
    obs.on_work_started(_info(8, 61001), StartReason.INITIAL)
    obs.on_work_started(_info(7, 61004), StartReason.RESUMED)
    assert obs.count(61004, "ended", "PAUSED") == 1
    assert obs.count(61001, "ended", "PAUSED") == 0
    ex = obs.pause_example(61004, 0.0)
    assert ex is not None and ex[0].work_id == ex[1].work_id == 7 and ex[1].t >= ex[0].t


def test_status_excerpt_names_apps_by_uid() -> None:
    dump = {"budget": {"used": 3, "thermal_scaled": 4}, "thermal": {"status": "NONE"},
            "requests": [{"uid": 61001, "request_id": 1, "state": "loaded",
                          "size": "LESS_THAN_1GB", "priority": "NORMAL", "rank": 100}]}
    lines = status_excerpt(dump, {61001: "camera"})
    assert lines[0] == "npu status: budget 3/4 used, thermal NONE"
    assert lines[1].split() == ["camera", "request", "1:", "loaded", "<1GB", "NORMAL", "rank",
                                "100"]


def _echo_app(out: Outbox, commands: LineQueue) -> None:
    stop = threading.Event()
    commands.start(lambda item: stop.set() if item.get("cmd") == "stop" else None)
    out.emit("hello", uid=os.getuid(), gid=os.getgid())
    stop.wait(10)
    out.emit("bye")


@pytest.mark.skipif(os.getuid() != 0, reason="setuid needs root")
def test_app_process_runs_as_its_uid_and_stops_when_asked(tmp_path: Any) -> None:
    log = EventLog()
    proc = AppProcess("echo", 61099, _echo_app, log.add, str(tmp_path / "echo.log"))
    try:
        hello = log.wait("echo", "hello", 5.0)
        assert hello is not None and (hello["uid"], hello["gid"]) == (61099, 61099)
        proc.stop(timeout=5.0)
        assert log.wait("echo", "bye", 1.0) is not None
        assert proc.poll()
    finally:
        proc.kill()
