"""A device's background lane routes each grant by the request's effective class
(service/host_lanes.grant_target), with a real npud, two real reference driver hosts and
real sockets. The app here is root, whose importance is fixed (FOREGROUND), so an [[app]]
entry gives its row in the drivers' table a background app priority: its NORMAL request
is then BACKGROUND, its grant the lane's, and its model runs in the lane's process. A
restarted npud whose config says otherwise tells the adopted grant to the host that holds
it (the lane), then moves it where its config puts it (service/grant_moves.py): the app's
model keeps serving on the lane, follows to the main host, and the grant's end reaches
both."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import NpuManager, nn
from npumanager.errors import GrantRequired, GrantRevoked
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.onnx_models import add_model
from tests.nn.test_background_lane import (
    X,
    grant,
    held_requests,
    lane_config,
    lane_sock,
    wait_until,
)

pytestmark = pytest.mark.slow


def background_root(**manager: Any) -> dict[str, Any]:
    """lane_config with root's row in the drivers' table at app priority 400 (CACHED):
    the drivers run root's models as BACKGROUND (above foreground_priority 200)."""
    cfg = lane_config(**manager)
    cfg["app"] = [{"uid": 0, "app_priority": 400}]
    return cfg


def test_a_normal_request_of_a_background_app_is_the_lanes(runtime_dir: Path,
                                                           state_dir: Path) -> None:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    main_sock = runtime_dir / "drivers" / "reference.sock"
    with DaemonProcess(runtime_dir, background_root(), drivers=True, env=env,
                       ready_timeout=60) as npud, NpuManager(runtime_dir) as mgr:
        req, cb = grant(mgr, 1)  # NORMAL
        assert cb.listener.lane == "background"
        dev = nn.device("reference", runtime_dir)
        try:
            with pytest.raises(GrantRequired, match="background lane only"):
                dev.prepare_model(add_model(), grant=cb.listener.grant_id)  # the main host
            model = dev.prepare_model(add_model(), grant=cb.listener)
            assert model.device.socket_path == str(lane_sock(runtime_dir))
            np.testing.assert_array_equal(model.execute({"x": X})["y"], X + 1)
            assert (held_requests(main_sock), held_requests(lane_sock(runtime_dir))) == (
                [], [1])
            cb.listener.notify_model_unloaded(req)
            cb.wait_for("COMPLETE", 30)
            assert held_requests(lane_sock(runtime_dir)) == []
        finally:
            dev.close()
    assert "Traceback" not in npud.output


def test_a_restarted_npud_moves_an_adopted_grant_where_its_config_puts_it(
        runtime_dir: Path, state_dir: Path) -> None:
    """The first npud routes root's NORMAL grant to the lane; the second one's config has no
    [[app]] entry (root foreground: the rule now says the main host). The lane reported the
    grant when it attached, so the grant is told to the lane again, then moved to the main
    host: the model keeps serving, follows, and the end reaches both hosts."""
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    first = DaemonProcess(runtime_dir, background_root(adopt_grace_s=5.0), drivers=True,
                          env=env, ready_timeout=60).start()
    second: DaemonProcess | None = None
    main_sock = runtime_dir / "drivers" / "reference.sock"
    try:
        with NpuManager(runtime_dir) as mgr:
            req, cb = grant(mgr, 1)
            assert cb.listener.lane == "background"
            dev = nn.device("reference", runtime_dir)
            try:
                model = dev.prepare_model(add_model(), grant=cb.listener)
                first.signal(signal.SIGKILL)
                assert first.proc is not None
                first.proc.wait(10)
                second = DaemonProcess(runtime_dir, lane_config(adopt_grace_s=5.0),
                                       drivers=True, env=env, ready_timeout=60).start()
                wait_until(lambda: {r["request_id"]: r["state"]
                                    for r in mgr.dump()["requests"]} == {1: "loaded"},
                           "the request adopted as loaded")
                # A new NORMAL request of root's is the main host's under this config.
                _req2, cb2 = grant(mgr, 2)
                assert cb2.listener.lane == ""
                # npu status says so: request 1's grant moved to the main host (once);
                # request 2 is where the rule puts it.
                reqs = {r["request_id"]: r for r in mgr.dump()["requests"]}
                assert (reqs[1]["lane"], reqs[1]["moves"]) == ("", 1), reqs
                assert reqs[2]["lane"] == "" and "moves" not in reqs[2], reqs
                # The model keeps serving on the lane, then follows its grant.
                np.testing.assert_array_equal(model.execute({"x": X})["y"], X + 1)
                wait_until(lambda: model.execute({"x": X}) and model.lane == "",
                           "the model on the main host")
                np.testing.assert_array_equal(model.execute({"x": X})["y"], X + 1)
                # A second model under the grant: the listener still says the lane, which
                # refuses (GrantMoved); prepare_model goes to the main host instead.
                again = dev.prepare_model(add_model(), grant=cb.listener)
                assert again.device.socket_path == str(main_sock)
                assert held_requests(lane_sock(runtime_dir)) == []
                cb.listener.notify_model_unloaded(req)
                cb.wait_for("COMPLETE", 30)
                # Both hosts applied the end: they hold nothing and refuse the model.
                assert held_requests(main_sock) == []
                assert held_requests(lane_sock(runtime_dir)) == []
                with pytest.raises(GrantRevoked):
                    model.execute({"x": X})
            finally:
                dev.close()
    finally:
        if second is not None:
            second.stop()
        if first.proc is not None and first.proc.poll() is None:
            first.proc.kill()
        first._cleanup()
    assert second is not None
    assert "driver reference (background lane) adopted" in second.output
    assert "did not acknowledge" not in second.output
    assert "Traceback" not in second.output
