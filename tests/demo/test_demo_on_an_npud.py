"""`npu demo --runtime-dir DIR` on an npud it cannot use: the reason comes first, in one line
on stderr, before the demo's title, its scenes or its model build, and nothing is left
running. It printed its title, scene 1 and 'built 4 ONNX models' before 'npu demo:
ServiceUnavailable ...', and on an npud without the apps' device (or a socket their uids
could not reach) ran a minute of scenes whose events never came."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from npumanager.testing.daemon import DaemonProcess, process_running
from tests.demo.conftest import LeftBehind
from tests.demo.runner import run_demo


def _demo(rt: Path, **kw: object) -> tuple[int, str, str]:
    return run_demo(["demo", "--fast", "--no-color", "--runtime-dir", str(rt), "--out", ""],
                    60, **kw)


@pytest.mark.timeout(90)
def test_no_npud_there_is_said_first(tmp_path: Path) -> None:
    rc, out, err = _demo(tmp_path / "none")
    assert (rc, out) == (1, ""), (rc, out)
    assert err.startswith("npu demo: ServiceUnavailable: no manager service at "), err
    assert len(err.splitlines()) == 1, err


@pytest.mark.timeout(90)
def test_an_npud_without_the_apps_device_is_said_first(runtime_dir: Path) -> None:
    with DaemonProcess(runtime_dir) as npud:  # no drivers: no 'reference' device
        rc, out, err = _demo(npud.runtime_dir)
    assert (rc, out) == (1, ""), (rc, out)
    assert err == (f"npu demo: the demo's apps run on device 'reference' (--driver); the npud "
                   f"in {runtime_dir} serves no device: drop --runtime-dir and the demo starts "
                   f"an npud of its own\n"), err


@pytest.mark.timeout(90)
def test_a_non_admin_is_told_first(runtime_dir: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to run as another uid")
    with DaemonProcess(runtime_dir) as npud:
        proc = subprocess.run(
            [sys.executable, "-m", "npumanager", "demo", "--fast", "--no-color",
             "--runtime-dir", str(npud.runtime_dir), "--out", ""],
            capture_output=True, text=True, timeout=60, user=65534, group=65534,
            stdin=subprocess.DEVNULL)
    assert (proc.returncode, proc.stdout) == (1, ""), proc
    assert proc.stderr.startswith("npu demo: the demo sets importances and overrides the "
                                  "thermal status, which needs admin rights"), proc.stderr


def test_a_socket_other_uids_cannot_reach_is_named(runtime_dir: Path) -> None:
    from npumanager.demo.scenario import unreachable_by_others

    closed = runtime_dir / "closed"
    rt = closed / "rt"
    rt.mkdir(parents=True)
    sock = rt / "npu.sock"
    sock.touch(mode=0o666)
    os.chmod(sock, 0o666)
    for d in (closed, rt):
        os.chmod(d, 0o755)
    assert unreachable_by_others(str(sock)) == ""
    os.chmod(closed, 0o700)
    assert unreachable_by_others(str(sock)) == f"{closed} is mode 0700 (others may not pass)"
    os.chmod(closed, 0o755)
    os.chmod(sock, 0o660)
    assert unreachable_by_others(str(sock)) == (f"the socket {sock} is mode 0660 (others may "
                                                f"not write)")


def _hold_connections(rt: str, n: int) -> None:
    """(As an app's uid) hold ``n`` connections to npud until the test says stop."""
    from npumanager.client import NpuManager
    from npumanager.testing import procs

    held = [NpuManager(rt, client_name=f"holder{i}") for i in range(n)]
    procs.announce("holding")
    procs.receive(timeout=None)
    for m in held:
        m.close()


@pytest.mark.timeout(120)
def test_an_app_that_cannot_connect_stops_the_demo_at_once(
        runtime_dir: Path, state_dir: Path, capsys: pytest.CaptureFixture[str],
        left_behind: LeftBehind) -> None:
    """The camera's uid is at npud's connection limit, so the camera cannot connect: the
    demo stops in its scene, says so in one line naming the app and its error, exits 1 and
    leaves nothing running. It waited out every scene (each wait cut to the demo's time,
    60 s with --fast) and only its summary said what had not happened."""
    if os.getuid() != 0:
        pytest.skip("the apps run under their own uids only as root")
    from npumanager.demo import DemoOptions
    from npumanager.demo import run_demo as run_in_process
    from npumanager.demo.cast import APP_UIDS
    from npumanager.testing import procs

    camera = APP_UIDS["camera"]
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    cfg = {"manager": {"max_connections_per_uid": 2}}
    with DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60) as npud:
        holder = procs.spawn_as(camera, None, _hold_connections, str(npud.runtime_dir), 2,
                                timeout=100)
        try:
            holder.expect("holding")
            capsys.readouterr()
            rc = run_in_process(DemoOptions(runtime_dir=str(npud.runtime_dir), fast=True,
                                            color=False, out=""))
            out, err = capsys.readouterr()
        finally:
            holder.send("stop")
            holder.wait(30)
        assert process_running(npud.pid)  # someone else's npud: the demo leaves it serving
    assert rc == 1, out
    assert err == (f"npu demo: its app camera (uid {camera}) could not connect: "
                   f"LimitExceeded: uid {camera} already has 2 connections to manager; "
                   "stopped (nothing it started is left running)\n"), err
    # It stopped in the camera's scene: no later scene, no wait timed out, no summary.
    assert "[3/6] The camera opens" in out and "[4/6]" not in out, out
    assert "did not happen" not in out and "Summary" not in out, out
    assert left_behind() == []  # the apps it started (the LLM's too) are gone
