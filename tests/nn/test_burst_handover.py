"""A model's open bursts move with it while they stream (nn/burst_handover.py), with a real
npud, two real reference driver hosts and real sockets.

As tests/nn/test_model_move.py: an app (another uid when the test runs as root) loads
while CACHED, so its grant and model are the lane's, and the admin raises or demotes it.
Here its streams never pause: a back-to-back burst, a pipeline, two bursts on two
threads each move while they run (the same burst objects, still open, served by the new
host only, every output right, no execution failed); a standby the new host refuses
leaves the stream served where it is until the host takes it."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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

pytestmark = pytest.mark.slow

#: The app's uid when the test runs as root (no such user needs to exist).
APP_UID = 50012


def x_of(i: int) -> np.ndarray:
    return X * (i % 7)


class Stream(threading.Thread):
    """Executes ``burst`` back to back (no pause) until stopped, each output checked."""

    def __init__(self, burst: nn.Burst) -> None:
        super().__init__(daemon=True)
        self.burst = burst
        self.n = self.wrong = 0
        self.failed: list[str] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            x = x_of(self.n)
            try:
                y = self.burst.execute({"x": x})["y"]
                self.wrong += not np.array_equal(y, x + 1)
            except Exception as exc:
                self.failed.append(f"{type(exc).__name__}: {exc}")
            self.n += 1

    def report(self) -> dict[str, Any]:
        self.stop.set()
        self.join(30)
        return {"runs": self.n, "wrong": self.wrong, "failed": self.failed}


def until(cond: Callable[[], bool], timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


@contextmanager
def app_model(runtime_dir: str) -> Iterator[nn.Model]:
    """A grant while the app is CACHED (the lane's) and the add model prepared there."""
    with NpuManager(runtime_dir, client_name="handover-app") as mgr:
        req, cb = grant(mgr, 1)
        dev = nn.device("reference", runtime_dir)
        try:
            model = dev.prepare_model(add_model(), grant=cb.listener)
            yield model
            model.release()
            cb.listener.notify_model_unloaded(req)
            cb.wait_for("COMPLETE", 30)
        finally:
            dev.close()


def bursts_of(uid: int, sock: Path) -> int:
    return sum(b["uid"] == uid for b in stats(sock)["bursts"])


@contextmanager
def lane_npud(runtime_dir: Path, state_dir: Path, fn: Callable[..., Any], *args: Any
              ) -> Iterator[tuple[NpuManager, procs.Child, int, Path, Path]]:
    """npud with a lane; ``fn`` running as the app, CACHED; (admin, app, its uid, the
    main host's socket, the lane's)."""
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    uid = APP_UID if os.getuid() == 0 else None
    app_uid = uid if uid is not None else os.getuid()
    with DaemonProcess(runtime_dir, lane_config(), drivers=True, env=env,
                       ready_timeout=60) as npud, NpuManager(runtime_dir) as admin:
        admin.set_uid_importance(app_uid, Importance.CACHED)
        app = procs.spawn_as(uid, None, fn, str(runtime_dir), *args, timeout=240)
        try:
            yield admin, app, app_uid, runtime_dir / "drivers" / "reference.sock", \
                lane_sock(runtime_dir)
        finally:
            app.kill()
        assert "Traceback" not in npud.output


def back_to_back_app(runtime_dir: str) -> dict[str, Any]:
    got: dict[str, Any] = {}
    with app_model(runtime_dir) as model:
        burst = model.burst()
        stream = Stream(burst)
        stream.start()
        procs.announce("streaming")
        for phase, lane in (("raised", ""), ("demoted", "background")):
            assert procs.receive(timeout=60) == phase
            moved = until(lambda lane=lane: model.lane == lane)
            at = stream.n
            until(lambda at=at: stream.n > at + 50)  # (it keeps streaming there)
            got[phase] = (moved, model.moves, burst.closed, stream.n > at)
            procs.announce(f"{phase}: moved")
        assert procs.receive(timeout=60) == "done"
        got["stream"] = stream.report()
        burst.close()
    return got


def test_a_back_to_back_burst_moves_while_it_streams(runtime_dir: Path,
                                                     state_dir: Path) -> None:
    with lane_npud(runtime_dir, state_dir, back_to_back_app) as (admin, app, uid, main,
                                                                   lane):
        app.expect("streaming", 90)
        assert (held_requests(main), held_requests(lane)) == ([], [1])
        assert (bursts_of(uid, main), bursts_of(uid, lane)) == (0, 1)
        for phase, imp, on, off in (("raised", Importance.FOREGROUND, main, lane),
                                    ("demoted", Importance.CACHED, lane, main)):
            admin.set_uid_importance(uid, imp)
            app.send(phase)
            app.expect(f"{phase}: moved", 90)
            # The new host serves the model and its one burst; the old one holds neither.
            assert (held_requests(on), held_requests(off)) == ([1], []), phase
            assert (bursts_of(uid, on), bursts_of(uid, off)) == (1, 0), phase
        app.send("done")
        got: dict[str, Any] = app.wait(90)
    # The same burst object, open throughout, moved twice while it ran back to back.
    assert got["raised"][:3] == (True, 1, False), got
    assert got["demoted"][:3] == (True, 2, False), got
    assert got["raised"][3] and got["demoted"][3], got
    assert got["stream"]["failed"] == [] and got["stream"]["wrong"] == 0, got
    assert got["stream"]["runs"] > 100, got


def pipeline_app(runtime_dir: str) -> dict[str, Any]:
    got: dict[str, Any] = {"out of order": 0}
    with app_model(runtime_dir) as model:
        state = {"n": 0, "more": -1}

        def inputs() -> Iterator[dict[str, np.ndarray]]:
            i = 0
            while state["more"] != 0 and i < 200_000:
                if i == 50:
                    procs.announce("streaming")
                if state["more"] < 0 and model.lane == "":
                    state["more"] = 200  # moved: 200 more through the new host
                elif state["more"] > 0:
                    state["more"] -= 1
                yield {"x": x_of(i)}
                i += 1

        with model.pipeline(depth=2) as p:
            bursts = list(p._bursts)
            for i, out in enumerate(p.map(inputs())):
                got["out of order"] += not np.array_equal(out["y"], x_of(i) + 1)
                state["n"] = i + 1
            got["moved"] = (model.lane, model.moves, [b.closed for b in bursts])
        got["runs"] = state["n"]
    return got


def test_a_pipeline_moves_while_it_runs(runtime_dir: Path, state_dir: Path) -> None:
    with lane_npud(runtime_dir, state_dir, pipeline_app) as (admin, app, uid, _, _):
        app.expect("streaming", 90)
        admin.set_uid_importance(uid, Importance.FOREGROUND)
        got: dict[str, Any] = app.wait(120)
    assert got["moved"] == ("", 1, [False, False]), got
    assert got["out of order"] == 0 and got["runs"] > 250, got


def two_bursts_app(runtime_dir: str) -> dict[str, Any]:
    with app_model(runtime_dir) as model:
        streams = [Stream(model.burst()) for _ in range(2)]
        for s in streams:
            s.start()
        procs.announce("streaming")
        moved = until(lambda: model.lane == "")
        at = [s.n for s in streams]
        until(lambda: all(s.n > a + 50 for s, a in zip(streams, at, strict=True)))
        procs.announce("moved")
        assert procs.receive(timeout=60) == "done"
        return {"moved": moved, "moves": model.moves,
                "streams": [s.report() for s in streams],
                "open": [not s.burst.closed for s in streams]}


def test_two_bursts_on_two_threads_both_move(runtime_dir: Path, state_dir: Path) -> None:
    with lane_npud(runtime_dir, state_dir, two_bursts_app) as (admin, app, uid, main,
                                                                 lane):
        app.expect("streaming", 90)
        assert (bursts_of(uid, main), bursts_of(uid, lane)) == (0, 2)
        admin.set_uid_importance(uid, Importance.FOREGROUND)
        app.expect("moved", 90)
        assert (bursts_of(uid, main), bursts_of(uid, lane)) == (2, 0)
        assert (held_requests(main), held_requests(lane)) == ([1], [])
        app.send("done")
        got: dict[str, Any] = app.wait(90)
    assert (got["moved"], got["moves"], got["open"]) == (True, 1, [True, True]), got
    for s in got["streams"]:
        assert s["failed"] == [] and s["wrong"] == 0 and s["runs"] > 50, got


def refused_app(runtime_dir: str) -> dict[str, Any]:
    """Once raised, the app fills its own connection to the main host with bursts of a
    second model there (8: a connection's most), so that the host refuses the standby:
    the stream stays on the lane; with those closed, it moves."""
    warnings: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())

    logging.getLogger("npumanager.nn").addHandler(Catch())
    got: dict[str, Any] = {}
    with app_model(runtime_dir) as model:
        burst = model.burst()
        procs.announce("loaded")
        assert procs.receive(timeout=60) == "raised"
        home = model.device.home
        assert model.recipe is not None
        filler = home.prepare_here(add_model(), model.recipe.grant_id)
        fill = [filler.burst() for _ in range(8)]
        stream = Stream(burst)
        stream.start()
        until(lambda: model._follow is not None and model._follow.ready is not None)
        until(lambda: bool(warnings), 10)
        time.sleep(1.5)
        got["while refused"] = (model.lane, model.moves, len(warnings))
        for b in fill:
            b.close()
        filler.release()
        got["moved after"] = until(lambda: model.lane == "", 30)
        got["moves"] = model.moves
        got["stream"] = stream.report()
        got["open"] = not burst.closed
        got["warnings"] = warnings
        burst.close()
    return got


def test_a_refused_standby_leaves_the_stream_served_until_it_moves(
        runtime_dir: Path, state_dir: Path) -> None:
    with lane_npud(runtime_dir, state_dir, refused_app) as (admin, app, uid, _, _):
        app.expect("loaded", 90)
        admin.set_uid_importance(uid, Importance.FOREGROUND)
        app.send("raised")
        got: dict[str, Any] = app.wait(120)
    # Refused: still on the lane, served, logged once; then it moved, the same burst open.
    assert got["while refused"] == ("background", 0, 1), got
    assert "could not move" in got["warnings"][0], got
    assert (got["moved after"], got["moves"], got["open"]) == (True, 1, True), got
    assert got["stream"]["failed"] == [] and got["stream"]["wrong"] == 0, got


def dead_host_app(runtime_dir: str) -> dict[str, Any]:
    """Raised with its hand-over refused (the connection to the main host full, as
    above), its stream on the lane: the test kills the lane. What its burst and its next
    plain execution got, the burst not closed by the app."""
    got: dict[str, Any] = {}
    with app_model(runtime_dir) as model:
        burst = model.burst()
        procs.announce("loaded")
        assert procs.receive(timeout=60) == "raised"
        assert model.recipe is not None
        filler = model.device.home.prepare_here(add_model(), model.recipe.grant_id)
        fill = [filler.burst() for _ in range(8)]
        errors: list[str] = []

        def stream() -> None:
            while True:
                try:
                    burst.execute({"x": X})
                except Exception as exc:
                    errors.append(type(exc).__name__)
                    return

        th = threading.Thread(target=stream, daemon=True)
        th.start()
        until(lambda: model._follow is not None and model._follow.ready is not None)
        time.sleep(0.3)  # (its hand-over refused)
        procs.announce(("refused", model.lane))
        assert procs.receive(timeout=60) == "killed"
        th.join(30)
        got["burst"] = (errors, burst.closed)
        y = model.execute({"x": X})["y"]  # the copy on the main host, swapped to
        got["after"] = (model.lane, model.moves, bool(np.array_equal(y, X + 1)))
        for b in fill:
            b.close()
        filler.release()
        burst.close()
    return got


def test_the_old_host_dying_before_the_switch_leaves_no_open_burst_without_a_channel(
        runtime_dir: Path, state_dir: Path) -> None:
    """The burst whose host died says so (its execution failed, it is closed: not open
    with no channel), and it does not keep the model from moving: its next execution runs
    on the new host."""
    with lane_npud(runtime_dir, state_dir, dead_host_app) as (admin, app, uid, _, lane):
        app.expect("loaded", 90)
        admin.set_uid_importance(uid, Importance.FOREGROUND)
        app.send("raised")
        assert app.expect(lambda e: e[0] == "refused", 90) == ("refused", "background")
        os.kill(stats(lane)["pid"], signal.SIGKILL)
        app.send("killed")
        got: dict[str, Any] = app.wait(90)
    assert got["burst"] == (["DeviceUnavailable"], True), got
    assert got["after"] == ("", 1, True), got
