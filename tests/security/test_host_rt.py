"""``[[driver]] foreground_rt_priority`` through the product path: a real npud (root), its
driver host as the unprivileged ``driver_user``, an app's burst. The host's burst thread
is SCHED_FIFO (applied by npud: the host cannot) while it serves FOREGROUND frames and
gone or SCHED_OTHER after; a run longer than ``foreground_rt_max_run_us`` lowers it. Read
from /proc, as root."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import ModelLoadRequest, NpuManager, nn
from npumanager.hal import rt_sched as rt
from npumanager.hal.wire import SERVICE
from npumanager.paths import driver_socket
from npumanager.proto.v1.wire_pb2 import Empty
from npumanager.testing.onnx_models import add_model, matmul_model
from npumanager.wire.client import SyncRpcClient
from tests.cli.conftest import npu_process
from tests.hal.test_rt_sched import needs_fifo
from tests.security.conftest import StartDaemon
from tests.security.harness import Lifecycle, driver_pid, needs_root
from tests.security.test_driver_user import expected_user

pytestmark = [needs_root, needs_fifo, pytest.mark.fifo]


def _driver(**keys: Any) -> list[dict[str, Any]]:
    # (every priority FOREGROUND: the test's uid has no scheduling config)
    return [{"name": "reference", "plugin": "reference", "background_sched": "normal",
             "foreground_priority": 1000, "foreground_rt_priority": 1, **keys}]


def fifo_threads(pid: int) -> dict[int, tuple[rt.ThreadSched, rt.ThreadOwner | None, str]]:
    """Process ``pid``'s threads at FIFO: their class, owner and name."""
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        s = rt.sched_of(int(t))
        if s is not None and s.fifo:
            try:
                with open(f"/proc/{pid}/task/{t}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                comm = ""
            out[int(t)] = (s, rt.owner_of(int(t)), comm)
    return out


def host_stats(runtime_dir: Path) -> dict[str, Any]:
    rpc = SyncRpcClient(str(driver_socket("reference", runtime_dir)), SERVICE)
    try:
        payload, _ = rpc.call("device.stats", Empty())
    finally:
        rpc.close()
    return dict(json.loads(payload))


def stream(runtime_dir: Path, source: bytes, x: np.ndarray,
           during: Callable[[], Any], frames: int = 200) -> tuple[list[Any], Any]:
    """An app (root here) streams ``frames`` frames through a burst; ``during()`` is called
    after each of the last frames, and once after the burst closed."""
    with NpuManager(runtime_dir, client_name="camera") as mgr:
        req = ModelLoadRequest(id=1)
        cb = Lifecycle()
        mgr.request_can_load_model(req, cb)
        cb.wait_for("CAN_LOAD_NOW")
        dev = nn.device("reference", runtime_dir)
        seen = []
        try:
            model = dev.prepare_model(source, grant=cb.listener)
            with model.burst() as b:
                for i in range(frames):
                    b.execute({"x": x})
                    time.sleep(0.002)
                    if i >= frames - 20:
                        seen.append(during())
            time.sleep(0.2)  # (the burst's thread ends after the close's answer)
            after = during()
            model.release()
        finally:
            dev.close()
        cb.listener.notify_model_unloaded(req)
        cb.wait_for("COMPLETE")
    return seen, after


def test_a_foreground_bursts_host_thread_is_fifo_while_serving_and_not_after(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    start_npud(drivers=True, driver=_driver())
    pid = driver_pid(runtime_dir)
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    seen, after = stream(runtime_dir, add_model(), x, lambda: fifo_threads(pid))
    user = expected_user().pw_uid
    # Once npud applied it (asynchronously, after the first FOREGROUND frame): one thread,
    # the burst's, of the host process, at FIFO 1, reset-on-fork.
    assert seen[-1] and len(seen[-1]) == 1, seen
    (tid, (s, owner, _comm)), = seen[-1].items()
    assert s == rt.ThreadSched(os.SCHED_FIFO, 1, True)
    assert owner == rt.ThreadOwner(pid, user) and tid != pid
    assert after == {}
    assert rt.sched_of(pid) == rt.ThreadSched(os.SCHED_OTHER, 0, False)  # its loop untouched
    st = host_stats(runtime_dir)["rt"]
    assert st["granted"] >= 1 and st["refused"] == 0 and st["wanted"] == 0, st
    # npud bounded the host's RLIMIT_RTTIME (hard) and the host set its soft limit.
    with open(f"/proc/{pid}/limits") as f:
        line = next(ln for ln in f if ln.startswith("Max realtime timeout"))
    assert line.split()[3:5] == ["50000", "500000"], line


def test_a_long_run_at_fifo_lowers_the_thread(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    # Runs of a 512-wide, 8-deep matmul take well over 100 µs: each lowers the thread
    # after its first run at FIFO, and it does not ask again for a second.
    start_npud(drivers=True, driver=_driver(foreground_rt_max_run_us=100))
    pid = driver_pid(runtime_dir)
    x = np.ones((16, 512), np.float32)
    seen, after = stream(runtime_dir, matmul_model(512, 8), x,
                         lambda: fifo_threads(pid), frames=60)
    st = host_stats(runtime_dir)["rt"]
    assert st["lowered_long"] >= 1, st
    assert after == {}
    # Lowered within a run of being made FIFO: at most the odd frame sees it at FIFO
    # (between npud's grant and the run that ends above the bound).
    assert sum(bool(s) for s in seen) <= 3, seen


def _restarted(start_npud: StartDaemon, runtime_dir: Path, forget: bool) -> int:
    """npud started, SIGKILLed (no stop: its host orphaned, its record of it left), and
    started again: the new npud adopts the same host process. ``forget``: the record
    removed before the restart. Returns the host's pid."""
    manager = {"orphan_grace_s": 60.0}
    npud = start_npud(drivers=True, driver=_driver(), manager=manager)
    pid = driver_pid(runtime_dir)
    record = runtime_dir / "drivers" / "reference.host"
    st = record.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o644)  # npud's, in npud's dir
    npud.proc.kill()  # type: ignore[union-attr]
    npud.proc.wait(10)  # type: ignore[union-attr]
    if forget:
        record.unlink()
    start_npud(drivers=True, driver=_driver(), manager=manager)
    assert driver_pid(runtime_dir) == pid  # adopted, not started anew
    return pid


def test_a_host_adopted_by_a_restarted_npud_gets_its_burst_thread_at_fifo(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    pid = _restarted(start_npud, runtime_dir, forget=False)
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    seen, after = stream(runtime_dir, add_model(), x, lambda: fifo_threads(pid))
    assert seen[-1] and len(seen[-1]) == 1, seen
    (tid, (s, owner, _comm)), = seen[-1].items()
    assert s == rt.ThreadSched(os.SCHED_FIFO, 1, True)
    assert owner == rt.ThreadOwner(pid, expected_user().pw_uid) and tid != pid
    assert after == {}
    st = host_stats(runtime_dir)["rt"]
    assert st["granted"] >= 1 and st["refused"] == 0, st


def test_a_host_adopted_without_npuds_record_gets_nothing(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    pid = _restarted(start_npud, runtime_dir, forget=True)
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    seen, after = stream(runtime_dir, add_model(), x, lambda: fifo_threads(pid))
    assert not any(seen) and after == {}, seen
    st = host_stats(runtime_dir)["rt"]
    assert st["granted"] == 0 and st["refused"] >= 1, st
    # Nor is it one started by hand (service/hand_ties.py): its socket's listener is the
    # host, which runs as the driver's user. `npu status` says so.
    why = (f"npud has no record of it ({runtime_dir}/drivers/reference.host); its "
           f"socket's listener (pid {pid}) runs as uid {expected_user().pw_uid}, not root")
    with NpuManager(runtime_dir) as admin:
        [device] = admin.dump()["devices"]
    assert device["hosts"]["no_rt"] == why, device
    status = npu_process("status", "--runtime-dir", str(runtime_dir))
    # (the hosts column is the table's last: its wrapped and folded lines join up)
    assert "".join(f"pid {pid} (no FIFO: {why})".split()) in "".join(status.stdout.split()), \
        status.stdout


def test_npud_killed_mid_stream_the_hosts_fifo_thread_is_lowered(
        start_npud: StartDaemon, runtime_dir: Path) -> None:
    """npud SIGKILLed while the host's burst thread is at FIFO serving FOREGROUND frames:
    its CPU watchdog gone, the host lowers the thread (drivers/rt_threads.npud_gone), and
    it stays normal while no npud is attached (the frames go on: a loaded model keeps
    running through the orphan grace)."""
    npud = start_npud(drivers=True, driver=_driver(), manager={"orphan_grace_s": 60.0})
    pid = driver_pid(runtime_dir)
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    with NpuManager(runtime_dir, client_name="camera", reconnect=False) as mgr:
        cb = Lifecycle()
        mgr.request_can_load_model(ModelLoadRequest(id=1), cb)
        cb.wait_for("CAN_LOAD_NOW")
        dev = nn.device("reference", runtime_dir)
        try:
            model = dev.prepare_model(add_model(), grant=cb.listener)
            with model.burst() as b:
                for _ in range(100):
                    b.execute({"x": x})
                    time.sleep(0.002)
                before = fifo_threads(pid)
                npud.proc.kill()  # type: ignore[union-attr]
                npud.proc.wait(10)  # type: ignore[union-attr]
                seen = []
                for _ in range(150):
                    b.execute({"x": x})
                    time.sleep(0.002)
                    seen.append(fifo_threads(pid))
        finally:
            dev.close()
    assert len(before) == 1, before
    assert not any(seen[-100:]), seen  # (the host sees the close within a few frames)
    st = host_stats(runtime_dir)["rt"]
    assert st["lowered_gone"] == 1 and st["wanted"] == 0, st
