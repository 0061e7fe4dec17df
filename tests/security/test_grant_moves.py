"""A grant that follows its uid's class between its device's two hosts
(service/grant_moves.py), under real uids:

* an app cannot move a grant: ``hal.grant_moved`` (and ``hal.grant_issued``) on a host's
  socket are npud's and admins' only, so neither another uid's model nor its own moves
  but by npud's table (the admin's importance);
* an app that never follows (a raw wire client ignoring the notice) keeps being served
  on the old host, every answer saying where the grant went, and the grant's end frees
  its model there;
* a flood of importance flips by the admin leaves each host holding at most the app's
  one model (bounded work and memory), every execution right."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from npumanager import ModelLoadRequest, NpuManager, tensorio
from npumanager.constants import Importance
from npumanager.errors import NpuError
from npumanager.hal.wire import SERVICE
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.testing import procs
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.onnx_models import add_model
from npumanager.wire.client import SyncRpcClient
from tests.nn.test_background_lane import stats
from tests.security.conftest import StartDaemon
from tests.security.driver_apps import X, granted, wait_until
from tests.security.harness import ATTACKER, BYSTANDER, Lifecycle, needs_root
from tests.security.test_lane_routing import held

pytestmark = needs_root

DRIVER = [{"name": "reference", "plugin": "reference", "background_sched": "normal",
           "grant_wait_s": 0.2, "background_host": True}]
RIGHT = (X + 1).ravel().tolist()


def models_held(socket_path: Path) -> int:
    return sum(g["models"] for g in stats(socket_path)["held"])


def socks(runtime_dir: Path) -> tuple[Path, Path]:
    d = runtime_dir / "drivers"
    return d / "reference.sock", d / "reference.background.sock"


@contextmanager
def background_app(start_npud: StartDaemon, runtime_dir: Path, uid: int,
                   fn: Callable[..., Any], *args: Any
                   ) -> Iterator[tuple[DaemonProcess, NpuManager, procs.Child]]:
    """npud with a background lane, ``uid`` made CACHED by the admin, ``fn`` running as it."""
    npud = start_npud(drivers=True, driver=DRIVER)
    with NpuManager(str(runtime_dir)) as admin:
        admin.set_uid_importance(uid, Importance.CACHED)
        app = procs.spawn_as(uid, None, fn, str(runtime_dir), *args, timeout=180)
        try:
            yield npud, admin, app
        finally:
            app.kill()


def raw_app(runtime_dir: str) -> dict[str, Any]:
    """A wire client that prepares on the lane by hand and never follows: each answer's
    notice, and what it gets once the grant ended."""
    got: dict[str, Any] = {"answers": []}
    _, lane = socks(Path(runtime_dir))
    with NpuManager(runtime_dir, client_name="raw-app") as mgr:
        req = ModelLoadRequest(1)
        cb = Lifecycle()
        mgr.request_can_load_model(req, cb)
        cb.wait_for("CAN_LOAD_NOW")
        got["lane"] = cb.listener.lane
        rpc = SyncRpcClient(str(lane), SERVICE, threaded=False, client_name="raw")
        try:
            payload, _ = rpc.call("device.prepare_model", pb.PrepareModel(
                onnx=add_model(), grant_id=cb.listener.grant_id, preference=1, priority=100))
            model_id = pb.PreparedModelMsg.FromString(payload).model_id

            def run() -> str:
                msg = pb.Execute(model_id=model_id)
                tensorio.add_inline(msg.inputs, "x", X)
                try:
                    out, _ = rpc.call("device.execute", msg)
                except NpuError as exc:
                    return f"{type(exc).__name__}: {exc}"
                res = pb.ExecuteResult.FromString(out)
                y = tensorio.inline_array(res.outputs[0]).ravel().tolist()
                return f"{y == RIGHT} moved={res.moved} to={res.moved_lane!r}"

            got["answers"].append(run())
            procs.announce("loaded")
            assert procs.receive(timeout=60) == "raised"
            for _ in range(5):
                got["answers"].append(run())
                time.sleep(0.02)
            procs.announce("served")
            assert procs.receive(timeout=60) == "end"
            cb.listener.notify_model_unloaded(req)
            cb.wait_for("COMPLETE", 30)
            got["after end"] = run()
        finally:
            rpc.close()
    return got


def test_an_app_that_never_follows_is_served_where_it_is_and_freed_by_the_end(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    main, lane = socks(runtime_dir)
    with background_app(start_npud, runtime_dir, ATTACKER, raw_app) as (npud, admin, app):
        app.expect("loaded", 60)
        assert (held(main), held(lane)) == ([], [(ATTACKER, 1)])
        admin.set_uid_importance(ATTACKER, Importance.FOREGROUND)
        app.send("raised")
        app.expect("served", 60)
        # Still on the lane, which knows its grant moved; nothing on the main host.
        assert (held(main), held(lane)) == ([], [(ATTACKER, 1)])
        assert stats(lane)["moved"] == 1
        app.send("end")
        got: dict[str, Any] = app.wait(60)
        assert (held(main), held(lane)) == ([], [])
        assert stats(lane)["moved"] == 0
    assert got["lane"] == "background", got
    assert got["answers"][0] == "True moved=False to=''", got
    assert got["answers"][1:] == ["True moved=True to=''"] * 5, got
    assert got["after end"].startswith("GrantRevoked"), got
    assert "Traceback" not in npud.output


def victim_app(runtime_dir: str) -> dict[str, Any]:
    """A BACKGROUND-importance app with a model on the lane, executing until told."""
    with granted(runtime_dir) as (dev, listener):
        model = dev.prepare_model(add_model(), grant=listener)
        procs.announce(("grant", listener.grant_id))
        assert procs.receive(timeout=60) == "attacked"
        outs = [model.execute({"x": X})["y"].ravel().tolist() for _ in range(5)]
        return {"outputs right": all(o == RIGHT for o in outs), "lane": model.lane,
                "moves": model.moves}


def attacker_moves(runtime_dir: str, grant_id: str) -> dict[str, str]:
    """Tell each host, as npud would, that the victim's grant moved / was issued."""
    out: dict[str, str] = {}
    for name, sock in zip(("main", "lane"), socks(Path(runtime_dir)), strict=True):
        rpc = SyncRpcClient(str(sock), SERVICE, threaded=False, client_name="attacker")
        try:
            for method, msg in (("hal.grant_moved", pb.GrantMoved(grant_id=grant_id, lane="")),
                                ("hal.grant_issued", pb.GrantIssued(
                                    uid=ATTACKER, request_id=9, grant_id=grant_id))):
                try:
                    rpc.call(method, msg)
                    out[f"{name} {method}"] = "accepted"
                except NpuError as exc:
                    out[f"{name} {method}"] = type(exc).__name__
        finally:
            rpc.close()
    return out


def test_an_app_cannot_move_a_grant(start_npud: StartDaemon, runtime_dir: Path) -> None:
    """Only npud's table moves a grant: the attacker's hal.grant_moved for the victim's
    grant (or its own) is refused by both hosts, and the victim stays on the lane."""
    _, lane = socks(runtime_dir)
    with background_app(start_npud, runtime_dir, BYSTANDER, victim_app) as (_, _, victim):
        _, gid = victim.expect(lambda e: isinstance(e, tuple) and e[0] == "grant", 60)
        tried = procs.run_as(ATTACKER, None, attacker_moves, str(runtime_dir), gid,
                             timeout=60)
        assert set(tried.values()) == {"PermissionDenied"}, tried
        assert stats(lane)["moved"] == 0 and held(lane) == [(BYSTANDER, 1)]
        victim.send("attacked")
        got: dict[str, Any] = victim.wait(60)
    assert got == {"outputs right": True, "lane": "background", "moves": 0}, got


def flipping_app(runtime_dir: str) -> dict[str, Any]:
    """Executes (and now and then opens a burst) until told to stop, while the admin
    flips its importance; every output checked."""
    got: dict[str, Any] = {"wrong": 0, "failed": [], "runs": 0}
    with granted(runtime_dir) as (dev, listener):
        model = dev.prepare_model(add_model(), grant=listener)
        procs.announce("loaded")
        stop = False
        while not stop:
            try:
                if got["runs"] % 10 == 9:
                    with model.burst() as b:
                        y = b.execute({"x": X})["y"]
                else:
                    y = model.execute({"x": X})["y"]
                got["wrong"] += y.ravel().tolist() != RIGHT
            except NpuError as exc:
                got["failed"].append(f"{type(exc).__name__}: {exc}")
            got["runs"] += 1
            try:
                stop = procs.receive(timeout=0.005) == "stop"
            except TimeoutError:
                pass
        got["moves"] = model.moves
        model.release()
    return got


def test_a_flood_of_importance_flips_holds_the_app_once_per_host_at_most(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    main, lane = socks(runtime_dir)
    most = 0
    with background_app(start_npud, runtime_dir, BYSTANDER, flipping_app) as (
            npud, admin, app):
        app.expect("loaded", 60)
        for i in range(200):
            admin.set_uid_importance(
                BYSTANDER, Importance.FOREGROUND if i % 2 == 0 else Importance.CACHED)
            if i % 20 == 0:
                most = max(most, models_held(main), models_held(lane))
                time.sleep(0.05)  # let the app follow now and then
        most = max(most, models_held(main), models_held(lane))
        app.send("stop")
        got: dict[str, Any] = app.wait(90)
        # (a copy being prepared when it released the model goes with its connection)
        wait_until(lambda: (models_held(main), models_held(lane)) == (0, 0), 30,
                   "both hosts free of the app's models")
    assert most <= 1, most  # one model per host at most, however many flips
    assert got["failed"] == [] and got["wrong"] == 0 and got["runs"] > 0, got
    assert "Traceback" not in npud.output
