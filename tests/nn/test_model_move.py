"""A model follows its app's class between its device's two hosts (service/grant_moves.py,
nn/model_move.py), with a real npud, two real reference driver hosts and real sockets.

An app (another uid when the test runs as root, whose own importance is fixed; else this
uid, which npud takes as an admin of its own) loads while BACKGROUND: its NORMAL
request's grant and model are the lane's. The admin raises it to FOREGROUND: the lane
keeps serving (an open burst across the change too) and says the grant moved; the model
is prepared on the main host, and the burst, paced as a camera's, is handed over there
between two frames; the lane frees its copy. Demoted, with no burst open, it is swapped back
before an execution, from the lane's own cache files; raised again, its next burst's open
follows first. Every output is right and no execution fails."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import NpuManager, nn
from npumanager.constants import Importance
from npumanager.testing import procs
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.onnx_models import add_model
from tests.nn.test_background_lane import X, grant, held_requests, lane_config, lane_sock, stats
from tests.ops.test_metrics import scrape, value

pytestmark = pytest.mark.slow

#: The app's uid when the test runs as root (no such user needs to exist).
APP_UID = 50011
TOKEN = bytes(range(32))


def _right(y: Any) -> bool:
    return bool(np.array_equal(y, X + 1))


def _until_on(model: nn.Model, lane: str, outs: list[bool], timeout: float = 60.0) -> int:
    """Execute until ``model`` runs on ``lane``'s host (its copy there swapped in before
    an execution); how many executions that took."""
    deadline = time.monotonic() + timeout
    n = 0
    while model.lane != lane:
        assert time.monotonic() < deadline, f"the model did not move to {lane or 'main'!r}"
        outs.append(_right(model.execute({"x": X})["y"]))
        n += 1
        time.sleep(0.01)
    return n


def moving_app(runtime_dir: str, cache_dir: str) -> dict[str, Any]:
    got: dict[str, Any] = {}
    outs: list[bool] = []
    with NpuManager(runtime_dir, client_name="moving-app") as mgr:
        req, cb = grant(mgr, 1)  # NORMAL, while the app's importance is CACHED
        got["granted on"] = cb.listener.lane
        dev = nn.device("reference", runtime_dir)
        try:
            model = dev.prepare_model(add_model(), grant=cb.listener, cache_dir=cache_dir,
                                      token=TOKEN)
            got["prepared on"] = model.lane
            outs.append(_right(model.execute({"x": X})["y"]))
            burst = model.burst()
            outs.append(_right(burst.execute({"x": X})["y"]))
            procs.announce("loaded")
            assert procs.receive(timeout=60) == "raised"
            # Raised: the burst open across the change keeps serving, paced as a camera's
            # (20 ms between frames), and is handed over to the main host between two frames.
            deadline = time.monotonic() + 60
            while model.lane != "" and time.monotonic() < deadline:
                outs.append(_right(burst.execute({"x": X})["y"]))
                time.sleep(0.02)
            got["burst moved to"] = (model.lane, not burst.closed)
            for _ in range(3):
                outs.append(_right(burst.execute({"x": X})["y"]))
            got["moves"] = model.moves
            burst.close()
            procs.announce("raised: moved")
            assert procs.receive(timeout=60) == "demoted"
            # Demoted, no burst open: plain executions, swapped before one of them.
            got["executions to move"] = _until_on(model, "background", outs)
            got["back from cache"] = model.loaded_from_cache
            got["moves back"] = model.moves
            procs.announce("demoted: moved")
            assert procs.receive(timeout=60) == "raised again"
            # Raised again, its next burst's open follows first, then opens on the main host.
            with model.burst() as b:
                got["burst opened on"] = model.lane
                outs.append(_right(b.execute({"x": X})["y"]))
            got["moves again"] = model.moves
            procs.announce("raised again: moved")
            assert procs.receive(timeout=60) == "done"
            got["outputs"] = outs
            cb.listener.notify_model_unloaded(req)
            cb.wait_for("COMPLETE", 30)
        finally:
            dev.close()
    return got


def test_a_model_follows_its_apps_class_between_the_hosts(runtime_dir: Path,
                                                          state_dir: Path) -> None:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    uid = APP_UID if os.getuid() == 0 else None
    app_uid = uid if uid is not None else os.getuid()
    cache_dir = tempfile.mkdtemp(prefix="npu-move-cache-", dir="/tmp")
    if uid is not None:
        os.chown(cache_dir, uid, uid)
    main_sock = runtime_dir / "drivers" / "reference.sock"
    try:
        with DaemonProcess(runtime_dir, lane_config(), drivers=True, env=env,
                           ready_timeout=60, extra_args=["--metrics", "127.0.0.1:0"]
                           ) as npud, NpuManager(runtime_dir) as admin:
            assert value(scrape(npud), "npu_grant_moves_total", device="reference") == 0
            admin.set_uid_importance(app_uid, Importance.CACHED)
            app = procs.spawn_as(uid, None, moving_app, str(runtime_dir), cache_dir,
                                 timeout=240)
            try:
                app.expect("loaded", 90)
                assert (held_requests(main_sock), held_requests(lane_sock(runtime_dir))) == (
                    [], [1])
                [r] = [r for r in admin.dump()["requests"] if r["uid"] == app_uid]
                loaded_bytes = r["real_bytes"]
                assert loaded_bytes > 0, r
                admin.set_uid_importance(app_uid, Importance.FOREGROUND)
                [r] = [r for r in admin.dump()["requests"] if r["uid"] == app_uid]
                assert (r["lane"], r["moves"]) == ("", 1), r  # npu status: the new host
                app.send("raised")
                app.expect("raised: moved", 90)
                # The lane freed its copy; the main host holds the model.
                assert (held_requests(main_sock), held_requests(lane_sock(runtime_dir))) == (
                    [1], [])
                assert stats(lane_sock(runtime_dir))["moved"] == 0
                admin.set_uid_importance(app_uid, Importance.CACHED)
                app.send("demoted")
                app.expect("demoted: moved", 90)
                assert (held_requests(main_sock), held_requests(lane_sock(runtime_dir))) == (
                    [], [1])
                [r] = [r for r in admin.dump()["requests"] if r["uid"] == app_uid]
                assert (r["lane"], r["moves"]) == ("background", 2), r
                # The device's one budget counts the model once (not once per move).
                assert r["real_bytes"] == loaded_bytes, r
                admin.set_uid_importance(app_uid, Importance.FOREGROUND)
                app.send("raised again")
                app.expect("raised again: moved", 90)
                assert (held_requests(main_sock), held_requests(lane_sock(runtime_dir))) == (
                    [1], [])
                # Three moves, each counted once (npu_grant_moves_total).
                assert value(scrape(npud), "npu_grant_moves_total", device="reference") == 3
                app.send("done")
                got: dict[str, Any] = app.wait(90)
            finally:
                app.kill()
            assert held_requests(main_sock) == [] and held_requests(lane_sock(runtime_dir)) == []
        assert (got["granted on"], got["prepared on"]) == ("background", "background"), got
        # The open burst moved with the model, still open (handed over to a channel on
        # the new host: nn/burst_handover.py).
        assert got["burst moved to"] == ("", True) and got["moves"] == 1, got
        assert got["executions to move"] >= 1 and got["moves back"] == 2, got
        assert got["back from cache"] is True, got  # the lane's own cache files
        assert got["burst opened on"] == "" and got["moves again"] == 3, got
        assert got["outputs"] and all(got["outputs"]), got
        assert "Traceback" not in npud.output
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
