"""npud SIGKILLed and restarted while an app keeps executing: the driver keeps the model,
the SDK reconnects and re-registers, the new npud adopts the grant (no callback), and
`npu status --story` shows the adoption."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import (
    LoadStatus,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelSize,
    NpuManager,
    RequestStatus,
    nn,
)
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.onnx_models import add_model

pytestmark = pytest.mark.slow


class Recorder(ModelLoadRequestCallback):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.listener: Any = None
        self.granted = threading.Event()
        self.ended = threading.Event()

    def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
        self.events.append(("can", status))
        if status == LoadStatus.CAN_LOAD_NOW:
            self.listener = listener
            self.granted.set()

    def on_request_unload_model(self, request: Any, reason: Any) -> None:
        self.events.append(("unload", reason))

    def on_model_load_request_complete(self, request: Any, status: Any) -> None:
        self.events.append(("complete", status))
        self.ended.set()


def wait_until(cond: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = cond()
        except Exception:
            got = None
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_sigkilled_npud_is_a_non_event_for_an_app_that_keeps_executing(
        runtime_dir: Path, state_dir: Path) -> None:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    config = {"manager": {"adopt_grace_s": 5.0}}
    first = DaemonProcess(runtime_dir, config, drivers=True, env=env, ready_timeout=60).start()
    second: DaemonProcess | None = None
    stop = threading.Event()
    ok, failed = [0], [0]
    try:
        with NpuManager(runtime_dir) as mgr:
            req = ModelLoadRequest(1, ModelSize.BETWEEN_1GB_AND_2GB)
            cb = Recorder()
            mgr.request_can_load_model(req, cb)
            assert cb.granted.wait(10)
            dev = nn.device("reference", runtime_dir)
            model = dev.prepare_model(add_model(), grant=cb.listener)
            cb.listener.notify_model_loaded(req)
            x = np.ones((1, 4), np.float32)

            def app() -> None:
                while not stop.is_set():
                    try:
                        np.testing.assert_array_equal(model.execute({"x": x})["y"], x + 1)
                        ok[0] += 1
                    except Exception:
                        failed[0] += 1
                        time.sleep(0.01)

            worker = threading.Thread(target=app)
            worker.start()
            wait_until(lambda: ok[0] > 5, "executions before the kill")
            first.signal(signal.SIGKILL)
            assert first.proc is not None
            first.proc.wait(10)
            at_kill = ok[0]
            wait_until(lambda: ok[0] > at_kill + 5, "executions while npud is dead")
            second = DaemonProcess(runtime_dir, config, drivers=True, env=env,
                                   ready_timeout=60).start()
            # The SDK reconnects by itself and re-registers; npud adopts the loaded grant.
            dump = wait_until(lambda: [r for r in mgr.dump()["requests"]
                                       if r["request_id"] == 1 and r["state"] == "loaded"],
                              "the request adopted as loaded")
            assert dump[0]["grant"] is not None
            at_adopt = ok[0]
            wait_until(lambda: ok[0] > at_adopt + 5, "executions after the restart")
            stop.set()
            worker.join(10)
            assert failed[0] == 0, f"{failed[0]} executions failed across the restart"
            # No callback at all for the adopted request.
            assert cb.events == [("can", LoadStatus.CAN_LOAD_NOW)]
            r = subprocess.run([sys.executable, "-m", "npumanager", "status", "--story", "1",
                                "--runtime-dir", str(runtime_dir)],
                               capture_output=True, text=True, timeout=30, env=env)
            assert r.returncode == 0, r.stderr
            assert "held by driver after restart" in r.stdout and "adopted" in r.stdout
            assert "held_by_driver yes" in r.stdout
            # It is an ordinary holder again: unloading completes it.
            model.release()
            cb.listener.notify_model_unloaded(req)
            assert cb.ended.wait(10)
            assert cb.events[-1] == ("complete", RequestStatus.COMPLETE)
            dev.close()
    finally:
        stop.set()
        if second is not None:
            second.stop()
        if first.proc is not None and first.proc.poll() is None:
            first.proc.kill()
        first._cleanup()
    assert second is not None
    assert "driver reference adopted" in second.output
    assert "Traceback" not in second.output


def test_the_async_client_reconnects_and_keeps_its_grant(
        runtime_dir: Path, state_dir: Path) -> None:
    import asyncio

    from npumanager import AsyncNpuManager

    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    first = DaemonProcess(runtime_dir, drivers=False, env=env).start()
    second: DaemonProcess | None = None
    events: list[tuple[str, Any]] = []

    class Cb(ModelLoadRequestCallback):
        def on_can_load_model(self, request: Any, status: Any, listener: Any) -> None:
            events.append(("can", status))

        def on_request_unload_model(self, request: Any, reason: Any) -> None:
            events.append(("unload", reason))

        def on_model_load_request_complete(self, request: Any, status: Any) -> None:
            events.append(("complete", status))

    async def main() -> list[dict[str, Any]]:
        nonlocal second
        mgr = await AsyncNpuManager.connect(runtime_dir)
        try:
            listener = await mgr.request_can_load_model(ModelLoadRequest(7), Cb())
            while listener.grant_id is None:
                await asyncio.sleep(0.01)
            await listener.notify_model_loaded(ModelLoadRequest(7))
            first.signal(signal.SIGKILL)
            assert first.proc is not None
            await asyncio.to_thread(first.proc.wait, 10)
            second = await asyncio.to_thread(
                DaemonProcess(runtime_dir, drivers=False, env=env).start)
            deadline = time.monotonic() + 20
            while True:
                try:
                    reqs: list[dict[str, Any]] = (await mgr.dump())["requests"]
                    if reqs:
                        return reqs
                except Exception:
                    pass
                assert time.monotonic() < deadline, "not re-registered"
                await asyncio.sleep(0.05)
        finally:
            await mgr.close()

    try:
        reqs = asyncio.run(main())
    finally:
        if second is not None:
            second.stop()
        first.stop()
    # No driver knows the grant (a pure manager): adopted granted-not-loaded, no callback.
    assert [(r["request_id"], r["state"]) for r in reqs] == [(7, "granted")]
    assert events == [("can", LoadStatus.CAN_LOAD_NOW)]
