"""Foreground protection by default (``[manager] protect_foreground = "auto"``,
service/protection.py) with a real `npu serve`, real driver hosts and a real app: as root
with CAP_SYS_NICE npud starts the background lane and grants a FOREGROUND app's
``burst(realtime=True)``; with the capability dropped (capsh) it resolves to off, says why
and how to fix it, starts no lane and refuses the app's request as before. `npu status`
and `npu serve --check-config` say what is (or would be) in force."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from npumanager import NpuManager
from npumanager.service.rt_privilege import CAP_SYS_NICE, DROP_IN, has_cap
from npumanager.testing import procs
from npumanager.testing.daemon import DaemonProcess, stop_driver_hosts
from tests.cli.test_fifo_privilege import NPU, check_config, needs_capsh
from tests.security.test_app_realtime import burst_realtime

pytestmark = [pytest.mark.slow, pytest.mark.fifo]

ON = "foreground protection: on (auto: npud can put threads at SCHED_FIFO)"
OFF = "foreground protection: off (auto: npud lacks CAP_SYS_NICE. Fix: install " + DROP_IN
#: No protection key set: what the product's default makes of it. (Background work at
#: normal priority, as tests/security's npud: the app's steps must not wait for a core.)
CONFIG = ('[manager]\nlog_level = "info"\n\n[[driver]]\nname = "reference"\n'
          'plugin = "reference"\nbackground_sched = "normal"\n')


@contextmanager
def serving(prefix: list[str], runtime_dir: Path, state_dir: Path, cfg: Path
            ) -> Iterator[list[str]]:
    """`npu serve --config cfg` (drivers on, no --protect-foreground) under ``prefix`` until
    ready; yields its output lines so far; SIGTERM and its hosts stopped at the end."""
    argv = [NPU, "serve", "--config", str(cfg), "--runtime-dir", str(runtime_dir)]
    if prefix[:1] == ["capsh"]:
        argv = [*prefix, "-c", "exec " + " ".join(argv)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, NPU_STATE_DIR=str(state_dir)))
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("npud ready"):
                break
        assert any(ln.startswith("npud ready") for ln in lines), "\n".join(lines)
        yield lines
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        stop_driver_hosts(runtime_dir)


def hosts(runtime_dir: Path) -> dict[str, Any]:
    with NpuManager(runtime_dir) as mgr:
        out: dict[str, Any] = mgr.dump()["devices"][0]["hosts"]
        return out


def status(runtime_dir: Path) -> str:
    run = subprocess.run([NPU, "status", "--runtime-dir", str(runtime_dir)],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    return run.stdout


def config_file(where: Path, body: str = CONFIG) -> Path:
    path = where / "npud.toml"
    path.write_text(body)
    os.chmod(path, 0o644)
    return path


@pytest.mark.skipif(os.geteuid() != 0 or not has_cap(CAP_SYS_NICE),
                    reason="needs root with CAP_SYS_NICE")
def test_root_with_the_capability_is_protected_by_default(
        runtime_dir: Path, state_dir: Path) -> None:
    cfg = {"manager": {"log_level": "info"},
           "driver": [{"name": "reference", "plugin": "reference",
                       "background_sched": "normal"}]}
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    with DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60,
                       protect_foreground=None) as npud:
        assert npud.count_output(ON) == 1, npud.output
        assert npud.wait_for_output("driver reference (background lane) is up", 30), \
            npud.output
        lane = hosts(runtime_dir).get("background")
        assert isinstance(lane, dict) and lane.get("up") and lane.get("pid"), lane
        assert "protect:  on (auto: npud can put threads at SCHED_FIFO)" in status(runtime_dir)
        # A FOREGROUND app (root's child: uid 0 is FOREGROUND to npud) gets its burst's
        # thread at SCHED_FIFO with no key set.
        got = procs.run_as(None, None, burst_realtime, str(runtime_dir), timeout=60)
        assert got == {"y": [1.0, 2.0, 3.0, 4.0], "granted": True, "fifo": True,
                       "error": None, "after_close": True}, got
    assert "Traceback" not in npud.output
    # Each host's start is one line (the lane's was logged twice, once without its version).
    assert npud.count_output("driver reference (background lane) is up") == 1, npud.output
    assert npud.count_output("driver reference is up") == 1, npud.output


@needs_capsh
def test_without_the_capability_auto_is_off_and_says_why(
        tmp_path: Path, runtime_dir: Path, state_dir: Path) -> None:
    with serving(["capsh", "--drop=cap_sys_nice", "--"], runtime_dir, state_dir,
                 config_file(tmp_path)) as lines:
        said = [ln for ln in lines if "foreground protection:" in ln]
        assert len(said) == 1 and OFF in said[0] and "warning" in said[0], lines
        assert 'protect_foreground = "on"' in said[0], said
        assert "background" not in hosts(runtime_dir)  # no lane
        assert "protect:  off (auto: npud lacks CAP_SYS_NICE" in status(runtime_dir)
        got = procs.run_as(None, None, burst_realtime, str(runtime_dir), timeout=60)
        assert got == {"y": [1.0, 2.0, 3.0, 4.0], "granted": False, "fifo": False,
                       "error": "RealtimeUnavailable", "after_close": True}, got


@needs_capsh
def test_check_config_says_what_auto_resolves_to_in_the_checking_process(
        tmp_path: Path, runtime_dir: Path) -> None:
    cfg = config_file(tmp_path)
    held = check_config(cfg, runtime_dir, [])
    assert held.returncode == 0, held.stderr
    assert "foreground protection: auto; in this process: on (npud can put threads at " \
        "SCHED_FIFO)" in held.stdout.splitlines(), held.stdout
    dropped = check_config(cfg, runtime_dir, ["capsh", "--drop=cap_sys_nice", "--"])
    assert dropped.returncode == 0, dropped.stderr
    line = [ln for ln in dropped.stdout.splitlines() if ln.startswith("foreground protection")]
    assert line == [f"foreground protection: auto; in this process: off (npud lacks "
                    f"CAP_SYS_NICE. Fix: install {DROP_IN} under systemd (CAP_SYS_NICE, "
                    "RestrictRealtime=no), or set [manager] protect_foreground = \"on\" for "
                    "the background lane and its keys alone)"], dropped.stdout
    # No FIFO key in force there: no note about one.
    assert not [ln for ln in dropped.stdout.splitlines() if ln.startswith("note: ")], \
        dropped.stdout
    # The flag wins over the file, in the check too.
    on = check_config(cfg, runtime_dir, ["capsh", "--drop=cap_sys_nice", "--"],
                      "--protect-foreground", "on")
    assert 'foreground protection: on (protect_foreground = "on")' in on.stdout, on.stdout
    assert "note: [manager] app_rt_priority = 2 is set, but this process lacks " \
        "CAP_SYS_NICE" in on.stdout, on.stdout


def test_a_restarted_npud_resolves_the_same_and_adopts_the_lane(
        runtime_dir: Path, state_dir: Path) -> None:
    """ARCHITECTURE "restart without losing the world": the next npud, with the same file and
    privileges, runs the same effective config ("on" here, as the flag: the lane without
    depending on the capability) and adopts both hosts, the lane included."""
    cfg = {"manager": {"adopt_grace_s": 5.0},
           "driver": [{"name": "reference", "plugin": "reference",
                       "background_sched": "normal"}]}
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    first = DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60,
                          protect_foreground="on").start()
    second: DaemonProcess | None = None
    try:
        assert first.wait_for_output("driver reference (background lane) is up", 30)
        before = hosts(runtime_dir)
        first.stop(keep_drivers=True)
        second = DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60,
                               protect_foreground="on").start()
        assert second.wait_for_output("driver reference (background lane) adopted", 30), \
            second.output
        assert hosts(runtime_dir) == before  # the same two processes
    finally:
        if second is not None:
            second.stop()
        first.stop()
    assert "driver reference adopted" in second.output
    assert second.count_output('foreground protection: on (protect_foreground = "on")') == 1
