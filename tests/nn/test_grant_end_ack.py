"""npud answers the end of a grant only once the driver applied it (service/ending.py), with
a real npud, a real driver host and real sockets: an app's COMPLETE comes after the driver
acknowledged, and a driver that cannot acknowledge (stopped: SIGSTOP) is restarted after
``grant_end_ack_s``, its grant's end applied, and npud keeps serving."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from npumanager import ModelLoadRequest, NpuManager, nn
from npumanager.errors import GrantRevoked
from npumanager.testing.daemon import DaemonProcess, driver_hosts
from npumanager.testing.onnx_models import add_model
from tests.security.harness import Lifecycle

pytestmark = pytest.mark.slow

ACK_S = 6.0  # long enough that a loaded machine's stall between two calls stays inside it


@pytest.fixture
def npud(runtime_dir: Path, state_dir: Path) -> Iterator[DaemonProcess]:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    cfg = {"manager": {"grant_end_ack_s": ACK_S}}
    with DaemonProcess(runtime_dir, drivers=True, env=env, config=cfg,
                       ready_timeout=60) as d:
        yield d


def test_complete_comes_after_the_driver_released_the_model(npud: DaemonProcess,
                                                             runtime_dir: Path) -> None:
    x = np.zeros((1, 4), np.float32)
    with NpuManager(runtime_dir, client_name="app") as mgr:
        dev = nn.device("reference", runtime_dir)
        try:
            for rid in range(1, 6):  # every time, not once
                req = ModelLoadRequest(id=rid)
                cb = Lifecycle()
                mgr.request_can_load_model(req, cb)
                cb.wait_for("CAN_LOAD_NOW", 30)
                model = dev.prepare_model(add_model(), grant=cb.listener)
                np.testing.assert_array_equal(model.execute({"x": x})["y"], x + 1)
                cb.listener.notify_model_unloaded(req)
                cb.wait_for("COMPLETE", 60)
                # The first execution after COMPLETE is refused: the driver had applied it.
                with pytest.raises(GrantRevoked):
                    model.execute({"x": x})
        finally:
            dev.close()


def test_a_driver_that_does_not_acknowledge_is_restarted_and_the_end_applied(
        npud: DaemonProcess, runtime_dir: Path) -> None:
    [host] = driver_hosts(runtime_dir)
    up = "driver reference is up"
    starts = npud.count_output(up)
    with NpuManager(runtime_dir, client_name="app") as mgr:
        req = ModelLoadRequest(id=1)
        cb = Lifecycle()
        mgr.request_can_load_model(req, cb)
        cb.wait_for("CAN_LOAD_NOW", 30)
        dev = nn.device("reference", runtime_dir)
        try:
            dev.prepare_model(add_model(), grant=cb.listener)
            os.kill(host, signal.SIGSTOP)  # hung: it reads nothing, acknowledges nothing
            try:
                cb.listener.notify_model_unloaded(req)
                # npud is waiting for the driver: the grant still holds its memory, and the
                # app has no answer yet.
                ending = mgr.dump()["ending"]
                assert [(e["uid"], e["request_id"]) for e in ending] == [(os.getuid(), 1)]
                assert "COMPLETE" not in cb.seen
                cb.wait_for("COMPLETE", ACK_S + 60)
            finally:
                # (killed by then, and maybe reaped already by npud: then there is no such
                # process to continue)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(host, signal.SIGCONT)
            assert npud.wait_for_output("did not acknowledge the end of grant", 30)
            assert npud.wait_for_output(up, 60, count=starts + 1), "the driver did not come back"
            assert host not in driver_hosts(runtime_dir)
            assert mgr.dump()["ending"] == []
        finally:
            dev.close()
        # npud and the restarted driver serve the next app.
        again = ModelLoadRequest(id=2)
        cb2 = Lifecycle()
        mgr.request_can_load_model(again, cb2)
        cb2.wait_for("CAN_LOAD_NOW", 30)
        dev = nn.device("reference", runtime_dir)
        try:
            model = dev.prepare_model(add_model(), grant=cb2.listener)
            x = np.zeros((1, 4), np.float32)
            np.testing.assert_array_equal(model.execute({"x": x})["y"], x + 1)
            cb2.listener.notify_model_unloaded(again)
            cb2.wait_for("COMPLETE", 60)
        finally:
            dev.close()
