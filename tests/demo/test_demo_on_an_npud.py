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

from npumanager.testing.daemon import DaemonProcess
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
