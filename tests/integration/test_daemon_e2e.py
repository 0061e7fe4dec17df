"""npud as a process: hostile frames, shutdown, the CLI against a live daemon."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from npumanager import (
    Importance,
    ModelLoadRequest,
    ModelLoadRequestCallback,
    ModelSize,
    NpuManager,
    RequestStatus,
)
from npumanager.errors import LimitExceeded, ServiceUnavailable
from npumanager.proto.v1.wire_pb2 import Frame, Hello
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.procs import spawn_as
from npumanager.wire.framing import PROTOCOL_VERSION, REQUEST, encode

from .apps import niced_app, scripted_app
from .conftest import BG, FG, THIRD, StartDaemon, request_state


def _npu(runtime_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npumanager", *args, "--runtime-dir",
                           str(runtime_dir)], capture_output=True, text=True, timeout=20)


def test_socket_mode_and_ready_line(npud: DaemonProcess, runtime_dir: Path) -> None:
    assert npud.ready_line is not None and "ready" in npud.ready_line
    st = os.stat(runtime_dir / "npu.sock")
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o666
    assert stat.S_IMODE(os.stat(runtime_dir).st_mode) == 0o755


@pytest.mark.parametrize("garbage", [
    struct.pack(">I", 1 << 30),                      # announces a 1 GiB frame
    struct.pack(">I", 6) + b"\xff\xfe\xfd\xfc\xfb\xfa",  # not a protobuf
    b"\x00\x00\x00\x03abc",                           # truncated nonsense
])
def test_malformed_frames_do_not_hurt_other_clients(admin: NpuManager, runtime_dir: Path,
                                                    garbage: bytes) -> None:
    with spawn_as(FG, None, scripted_app, runtime_dir, [(1, 0, 0)], until="exit") as app:
        app.expect(("loaded", 1))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(str(runtime_dir / "npu.sock"))
        hello = Hello(protocol_version=PROTOCOL_VERSION, service="manager")
        s.sendall(encode(Frame(kind=REQUEST, call_id=1, method="hello",
                               payload=hello.SerializeToString())))
        s.recv(4096)
        # A request whose payload is not a LoadRequest: a typed error, connection kept.
        s.sendall(encode(Frame(kind=REQUEST, call_id=2, method="request", payload=b"\xff\xff")))
        s.sendall(garbage)
        data = b""
        while True:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
        s.close()
        assert b"InvalidArgument" in data or b"ProtocolError" in data or b"FrameTooLarge" in data
        # Everyone else is still served and nothing was lost.
        assert admin.dump()["daemon"]["internal_errors"] == 0
        assert request_state(admin, FG, 1) == "loaded"
        app.send(("exit",))
        assert app.wait() == [("can", 1, "CAN_LOAD_NOW")]


def test_sigterm_keeps_live_requests_until_the_reconnect_window_passes(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    """SIGTERM is a restart for clients (npud says no goodbye): a live request gets no
    callback while the SDK reconnects, and calls raise ServiceUnavailable; only when no
    npud came back within the reconnect window does it end CANCELLED."""
    npud = start_npud()
    loaded, ended = threading.Event(), threading.Event()
    outcomes: list[tuple[int, RequestStatus]] = []

    class CB(ModelLoadRequestCallback):
        def on_can_load_model(self, request, status, listener):  # type: ignore[no-untyped-def]
            listener.notify_model_loaded(request)
            loaded.set()

        def on_model_load_request_complete(self, request, status):  # type: ignore[no-untyped-def]
            outcomes.append((request.id, status))
            ended.set()

    with NpuManager(runtime_dir, reconnect_window_s=8.0) as mgr:
        mgr.request_can_load_model(ModelLoadRequest(1, ModelSize.GREATER_THAN_2G), CB())
        assert loaded.wait(5), "request 1 was never granted"
        assert npud.stop() == 0
        assert not (runtime_dir / "npu.sock").exists()
        with pytest.raises(ServiceUnavailable):
            mgr.dump()
        with pytest.raises(ServiceUnavailable):
            mgr.request_can_load_model(ModelLoadRequest(2), CB())
        assert outcomes == []
        assert ended.wait(30), "the live request never ended after the reconnect window"
        assert outcomes == [(1, RequestStatus.CANCELLED)]
    assert "npud stopped" in npud.output


def test_no_daemon_is_service_unavailable(runtime_dir: Path) -> None:
    with pytest.raises(ServiceUnavailable):
        NpuManager(runtime_dir)


@pytest.mark.slow
def test_cli_status_policy_importance_thermal(admin: NpuManager, runtime_dir: Path) -> None:
    # Eight `npu` processes take ~10 s on a loaded 2-core machine: the app waits for "exit".
    with spawn_as(BG, None, scripted_app, runtime_dir, [(3, 2, 0)], until="exit",
                  run_for=60, timeout=90) as app:
        app.expect(("loaded", 3))
        r = _npu(runtime_dir, "policy", "set", "budget", "--max-budget", "6", "--weight", "2=3")
        assert r.returncode == 0, r.stderr
        r = _npu(runtime_dir, "importance", "set", str(BG), "perceptible")
        assert r.returncode == 0, r.stderr
        r = _npu(runtime_dir, "thermal", "override", "moderate")
        assert r.returncode == 0, r.stderr
        assert "MODERATE" in r.stdout
        r = _npu(runtime_dir, "status", "--json")
        assert r.returncode == 0, r.stderr
        dump = json.loads(r.stdout)
        r = _npu(runtime_dir, "status")
        assert r.returncode == 0, r.stderr
        text = r.stdout
        r = _npu(runtime_dir, "status", "--story", f"{BG}:3")
        assert r.returncode == 0, r.stderr
        story = r.stdout
        assert _npu(runtime_dir, "thermal", "reset").returncode == 0
        assert _npu(runtime_dir, "policy", "set", "budget", "--weight", "2=0").returncode == 2
        app.send(("exit",))
        app.wait()
    assert dump["policy"]["max_budget"] == 6
    assert dump["uids"][str(BG)]["importance"] == int(Importance.PERCEPTIBLE)
    assert dump["thermal"]["status"] == "MODERATE"
    [req] = [x for x in dump["requests"] if x["uid"] == BG]
    assert req["request_id"] == 3 and req["state"] == "loaded" and req["age_s"] >= 0
    assert "loaded" in text and str(BG) in text
    assert f"request 3 of uid {BG}" in story and "grant" in story.lower()
    assert admin.thermal_status().status.name == "NONE"


def test_importance_from_the_process_nice_value(start_npud: StartDaemon,
                                                runtime_dir: Path) -> None:
    start_npud(importance={"from_process": True, "recheck_interval_s": 0.1})
    with NpuManager(runtime_dir) as admin, \
            spawn_as(BG, None, niced_app, runtime_dir, 15, [(1, 0, 0)], until="exit") as app:
        app.expect(("loaded", 1))
        imp = admin.dump()["uids"][str(BG)]["importance"]
        app.send(("exit",))
        app.wait()
        assert admin.dump()["daemon"]["components"]["process_importance"] is True
    assert imp == int(Importance.CACHED)  # nice >= 10 -> cached (the default rules)


def test_admin_importance_beats_the_process_provider(start_npud: StartDaemon,
                                                    runtime_dir: Path) -> None:
    """Precedence: admin API, then [[app]], then the process; re-checks never undo an admin."""
    start_npud(importance={"from_process": True, "recheck_interval_s": 0.05})
    mid = int(ModelSize.BETWEEN_1GB_AND_2GB)
    with NpuManager(runtime_dir) as admin, \
            spawn_as(BG, None, niced_app, runtime_dir, 15, [(1, 0, 0)], until="exit") as app, \
            spawn_as(THIRD, None, niced_app, runtime_dir, 15, [(3, mid, 0)]) as filler:
        app.expect(("loaded", 1))
        filler.expect(("loaded", 3))
        # The control app (CACHED, like the filler) waits: 1 + 2 held, its 2 do not fit.
        with spawn_as(FG, None, niced_app, runtime_dir, 15, [(2, mid, 0)],
                      until="exit") as ctl:
            ctl.expect(("can", 2, "NOT_PRIORITIZED"))
            admin.set_uid_importance(BG, Importance.FOREGROUND)
            os.setpriority(os.PRIO_PROCESS, app.pid, 5)  # the provider now says SERVICE
            os.setpriority(os.PRIO_PROCESS, ctl.pid, 5)  # and for the control app too
            # A re-check pass covers every client: once the control app is SERVICE it
            # outranks the filler and gets its room, so a pass has run since both changes.
            ctl.expect(("loaded", 2))
            imp = importance(admin, BG)
            for proc in (app, ctl):
                proc.send(("exit",))
                proc.wait()
        assert ("unload", 3, "PREEMPTED") in filler.wait()
    assert imp == int(Importance.FOREGROUND)


def importance(admin: NpuManager, uid: int) -> int:
    return int(admin.dump()["uids"][str(uid)]["importance"])


def test_per_uid_bounds_on_requests_and_connections(start_npud: StartDaemon,
                                                    runtime_dir: Path) -> None:
    start_npud({"max_requests_per_uid": 3, "max_connections_per_uid": 2})
    with NpuManager(runtime_dir) as mgr:
        cb = ModelLoadRequestCallback()
        for i in range(3):
            mgr.request_can_load_model(ModelLoadRequest(i, ModelSize.GREATER_THAN_2G), cb)
        with pytest.raises(LimitExceeded):
            mgr.request_can_load_model(ModelLoadRequest(9), cb)
        with NpuManager(runtime_dir), pytest.raises((LimitExceeded, ServiceUnavailable)):
            NpuManager(runtime_dir)
        assert len(mgr.dump()["requests"]) == 3


def test_sigint_is_a_clean_shutdown_too(start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud()
    npud.signal(signal.SIGINT)
    assert npud.stop() == 0
    assert not (runtime_dir / "npu.sock").exists()


def test_json_logs_carry_every_decision(start_npud: StartDaemon, runtime_dir: Path) -> None:
    npud = start_npud({"log_format": "json"})
    with NpuManager(runtime_dir) as mgr:
        listener = mgr.request_can_load_model(ModelLoadRequest(5), ModelLoadRequestCallback())
        assert listener.grant_id is not None  # npud pushes the answer before its reply
        listener.notify_model_unloaded(ModelLoadRequest(5))
    assert npud.stop() == 0
    records = [json.loads(x) for x in npud.lines if not x.startswith("npud ready")]
    decisions = [r["decision"] for r in records if "decision" in r]
    assert decisions[:3] == ["granted", "grant ended", "request ended"]
    granted = next(r for r in records if r.get("decision") == "granted")
    assert granted["uid"] == os.getuid() and granted["request_id"] == 5


@pytest.mark.slow
def test_manager_only_demo_tells_the_story_and_exits_zero() -> None:
    r = subprocess.run([sys.executable, "-m", "npumanager", "demo", "--manager-only"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "asked to unload (PREEMPTED)" in out and "REVOKED" in out
    assert "request 2: CAN_LOAD_NOW" in out  # the LLM comes back once there is room
