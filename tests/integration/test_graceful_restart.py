"""A clean stop of npud (SIGTERM: `systemctl restart npud`, an upgrade; SIGINT: Ctrl-C of
`npu serve`) is a restart as seen by apps and drivers: npud says no goodbye, ends no
grant and stops no driver host. An app executing in a loop gets no callback and no failed
execute while a new npud starts on the same runtime dir and adopts the driver and the
grant; with no new npud the orphaned host releases its models after ``orphan_grace_s``
and exits, as after a crash."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from npumanager import LoadStatus, ModelLoadRequest, ModelSize, NpuManager, nn
from npumanager.errors import DeviceUnavailable, NoManagerAttached
from npumanager.testing.daemon import DaemonProcess, driver_hosts, process_running
from npumanager.testing.onnx_models import add_model
from tests.integration.test_restart import Recorder, wait_until

pytestmark = pytest.mark.slow

X = np.ones((1, 4), np.float32)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_clean_npud_restart_is_a_non_event_for_an_app_that_keeps_executing(
        runtime_dir: Path, state_dir: Path, sig: signal.Signals) -> None:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    config = {"manager": {"adopt_grace_s": 5.0}}
    first = DaemonProcess(runtime_dir, config, drivers=True, env=env, ready_timeout=60).start()
    second: DaemonProcess | None = None
    stop = threading.Event()
    ok, failed = [0], [0]
    try:
        [host] = driver_hosts(runtime_dir)
        with NpuManager(runtime_dir) as mgr:
            req = ModelLoadRequest(1, ModelSize.BETWEEN_1GB_AND_2GB)
            cb = Recorder()
            mgr.request_can_load_model(req, cb)
            assert cb.granted.wait(10)
            dev = nn.device("reference", runtime_dir)
            model = dev.prepare_model(add_model(), grant=cb.listener)
            cb.listener.notify_model_loaded(req)

            def app() -> None:
                while not stop.is_set():
                    try:
                        np.testing.assert_array_equal(model.execute({"x": X})["y"], X + 1)
                        ok[0] += 1
                    except Exception:
                        failed[0] += 1
                        time.sleep(0.01)

            worker = threading.Thread(target=app)
            worker.start()
            wait_until(lambda: ok[0] > 5, "executions before the stop")
            first.signal(sig)
            assert first.proc is not None
            assert first.proc.wait(20) == 0, first.output
            assert driver_hosts(runtime_dir) == [host], "npud stopped its driver host"
            at_stop = ok[0]
            wait_until(lambda: ok[0] > at_stop + 5, "executions while no npud runs")
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
            # No callback at all: not CANCELLED at the stop, not granted again after it.
            assert cb.events == [("can", LoadStatus.CAN_LOAD_NOW)]
            r = subprocess.run([sys.executable, "-m", "npumanager", "status", "--story", "1",
                                "--runtime-dir", str(runtime_dir)],
                               capture_output=True, text=True, timeout=30, env=env)
            assert r.returncode == 0, r.stderr
            assert "held by driver after restart" in r.stdout and "adopted" in r.stdout
            # The same host serves on: the new npud attached to it, started none.
            assert driver_hosts(runtime_dir) == [host]
            model.release()
            cb.listener.notify_model_unloaded(req)
            assert cb.ended.wait(10)
            dev.close()
    finally:
        stop.set()
        if second is not None:
            second.stop()
        first.stop()
    assert second is not None
    assert f"driver reference adopted (pid {host}," in second.output
    assert "drivers left running for the next npud to adopt" in first.output
    assert "Traceback" not in first.output + second.output


def test_after_a_clean_stop_with_no_restart_the_driver_releases_after_the_grace(
        runtime_dir: Path, state_dir: Path) -> None:
    """No new npud: the host serves its loaded models for ``orphan_grace_s``, loads nothing
    new, then releases them and exits (systemd's `stop` sends the same SIGTERM)."""
    grace = 4.0
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    npud = DaemonProcess(runtime_dir, {"manager": {"orphan_grace_s": grace}}, drivers=True,
                         env=env, ready_timeout=60).start()
    try:
        [host] = driver_hosts(runtime_dir)
        cb = Recorder()
        with NpuManager(runtime_dir) as mgr:
            mgr.request_can_load_model(ModelLoadRequest(1), cb)
            assert cb.granted.wait(10)
            dev = nn.device("reference", runtime_dir)
            model = dev.prepare_model(add_model(), grant=cb.listener)
            assert npud.stop(keep_drivers=True) == 0
            stopped = time.monotonic()
            for _ in range(3):  # the connected app keeps being served
                np.testing.assert_array_equal(model.execute({"x": X})["y"], X + 1)
            with pytest.raises(NoManagerAttached, match="loads nothing new until npud"):
                dev.prepare_model(add_model(), grant=cb.listener)
            assert time.monotonic() - stopped < grace, "the checks took longer than the grace"
            wait_until(lambda: not process_running(host), "the orphaned host to exit", 30)
            assert time.monotonic() - stopped >= grace, "it exited before the grace was over"
            with pytest.raises(DeviceUnavailable):
                model.execute({"x": X})
            dev.close()
    finally:
        npud.stop()
    assert "Traceback" not in npud.output
    assert "no manager attached again within 4 s" in npud.output


def test_a_host_too_slow_to_answer_is_attached_again_not_doubled(
        runtime_dir: Path, state_dir: Path) -> None:
    """A loaded machine: the orphaned host does not answer the new npud's attach in time.
    It still serves its loaded models, so npud must not start a second host on its socket
    path (the first would serve on, unseen and uncounted by npud): it attaches again until
    the host answers (or is gone)."""
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    config = {"manager": {"orphan_grace_s": 60.0}}
    first = DaemonProcess(runtime_dir, config, drivers=True, env=env, ready_timeout=60).start()
    second: DaemonProcess | None = None
    [host] = driver_hosts(runtime_dir)
    try:
        first.stop(keep_drivers=True)
        os.kill(host, signal.SIGSTOP)  # it answers nothing now, but its socket accepts
        second = DaemonProcess(runtime_dir, config, drivers=True, env=env,
                               ready_timeout=60).start()
        assert second.wait_for_output("did not answer npud in time", 30), second.output
        assert driver_hosts(runtime_dir) == [host], "npud started a second driver host"
        os.kill(host, signal.SIGCONT)
        assert second.wait_for_output(f"driver reference adopted (pid {host},", 60), \
            second.output
        assert driver_hosts(runtime_dir) == [host]
    finally:
        os.kill(host, signal.SIGCONT)
        if second is not None:
            second.stop()
        first.stop()
    assert "Traceback" not in second.output
