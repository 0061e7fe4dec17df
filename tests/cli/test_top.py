"""`npu top`: one frame with --once, and the live view in a real terminal (tmux)."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from npumanager import ModelLoadRequest, NpuManager, nn
from npumanager.cli.top import bar, render, sparkline
from npumanager.testing.daemon import DaemonProcess
from npumanager.testing.filewatch import DirectoryWatch
from npumanager.testing.grants import Granted
from npumanager.testing.onnx_models import add_model
from tests.cli.conftest import npu


def test_sparkline_and_bar() -> None:
    assert sparkline([]) == ""
    assert sparkline([1.0, 1.0]) == "▁▁"
    assert sparkline([30.0, 65.0, 100.0], 30.0, 100.0) == "▁▅█"
    assert bar(1, 4, 8) == "██······" and bar(0, 0, 3) == "···"


@pytest.fixture
def busy_npud(npud_drivers: DaemonProcess) -> Iterator[DaemonProcess]:
    """npud + the reference driver with one loaded model that has run 50 times."""
    rt = npud_drivers.runtime_dir
    with NpuManager(rt) as mgr, nn.device("reference", rt) as dev:
        cb = Granted()
        req = ModelLoadRequest(42)
        mgr.request_can_load_model(req, cb)
        assert cb.event.wait(10)
        model = dev.prepare_model(add_model(), grant=cb.listener)
        cb.listener.notify_model_loaded(req)
        for _ in range(50):
            model.execute({"x": np.ones((1, 4), np.float32)})
        try:
            yield npud_drivers
        finally:
            model.release()
            cb.listener.notify_model_unloaded(req)


@pytest.mark.slow
def test_once_prints_one_frame(busy_npud: DaemonProcess,
                               capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = npu(capsys, "top", "--once", "--runtime-dir", str(busy_npud.runtime_dir))
    assert rc == 0, err
    assert re.search(r"reference\s+█*·* ?1/4\s+\S* ?\d/3 busy\s+NONE", out), out
    assert re.search(rf"\b{os.getuid()}\s+42\s+<1GB\s+normal\s+loaded\b", out), out
    m = re.search(rf"\b{os.getuid()}\s+foreground \(100\)\s+reference\s+([\d.]+)\s+"
                  rf"([\d.]+) ms\s+([\d.]+) ms\s+(\d+)", out)
    assert m, out
    assert float(m.group(1)) > 0 and int(m.group(4)) == 50
    assert float(m.group(2)) <= float(m.group(3))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_live_view_in_a_terminal(busy_npud: DaemonProcess, tmp_path: Path) -> None:
    """Start `npu top` in a real terminal, read the screen as a person sees it, quit with
    Ctrl-C."""
    session = f"npu-top-{uuid.uuid4().hex[:8]}"
    npu_bin = Path(sys.executable).with_name("npu")
    # Our own tmux server, nobody else's, with no user config; a detached session's window
    # falls back to default-size when tmux recalculates sizes (80x24 unless set).
    conf = tmp_path / "tmux.conf"
    conf.write_text("set -g default-size 120x40\n")
    sock = ["-f", str(conf), "-S", str(tmp_path / "tmux.sock")]
    # When npu top quits, the pane's shell signals a tmux channel the test waits on.
    done = f"{session}-done"
    cmd = (f"{npu_bin} top --runtime-dir {busy_npud.runtime_dir} --interval 0.3; "
           f"tmux {' '.join(sock)} wait-for -S {done}")
    subprocess.run(["tmux", *sock, "new-session", "-d", "-s", session, "-x", "120", "-y",
                    "40", cmd], check=True, env=dict(os.environ, TERM="xterm-256color"))
    # Everything the pane prints is appended to a file: the test re-reads the screen each
    # time the kernel reports that file changed, instead of polling on a timer.
    pane_out = tmp_path / "pane"
    pane_out.mkdir()
    watch = DirectoryWatch(pane_out)
    subprocess.run(["tmux", *sock, "pipe-pane", "-t", session, f"cat >> {pane_out}/out"],
                   check=True)

    def screen() -> str:
        return subprocess.run(["tmux", *sock, "capture-pane", "-p", "-t", session],
                              capture_output=True, text=True).stdout

    try:
        shown = [""]

        def showing(pred: Callable[[str], object]) -> bool:
            shown[0] = screen()
            return bool(pred(shown[0]))

        # A whole frame at 120 columns: the screen can be caught mid-draw, and a frame once
        # came out 80 columns wide ("0.19 …" for p50 in the per-uid row).
        def whole_frame(s: str) -> bool:
            return bool("per uid" in s and re.search(r"\b42\s+<1GB", s) and re.search(
                r"foreground \(100\)\s+reference\s+[\d.]+\s+[\d.]+ ms", s))

        watch.wait_until(lambda: showing(whole_frame), 30)
        first_screen = shown[0]
        assert "npu top" in first_screen and "devices" in first_screen, first_screen
        assert re.search(r"reference\s+█*·* ?1/4", first_screen), first_screen
        assert re.search(r"\b42\s+<1GB\s+normal\s+loaded", first_screen), first_screen
        assert re.search(r"foreground \(100\)\s+reference\s+[\d.]+\s+[\d.]+ ms",
                         first_screen), first_screen
        # The clock in the header moves: the view is live.
        first = re.search(r"\d\d:\d\d:\d\d", first_screen)
        assert first

        def moved(s: str) -> bool:
            m = re.search(r"\d\d:\d\d:\d\d", s)
            return bool(m and first and m.group(0) != first.group(0))

        assert watch.wait_until(lambda: showing(moved), 30), "the frame did not refresh"
        subprocess.run(["tmux", *sock, "send-keys", "-t", session, "C-c"], check=True)
        # Returns when signalled, or fails to connect once the last session is gone (the
        # server exits with it): either way npu top quit. A hang is the failure.
        subprocess.run(["tmux", *sock, "wait-for", done], capture_output=True, timeout=30)
        # The session ends once its shell has run ``wait-for -S`` and exited: after the
        # signal, not with it (a loaded machine once saw it still there), so poll for it.
        def gone() -> bool:
            return subprocess.run(["tmux", *sock, "has-session", "-t", session],
                                  capture_output=True).returncode != 0

        deadline = time.monotonic() + 30
        while not gone() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(), "npu top did not quit on Ctrl-C"
    finally:
        watch.close()
        subprocess.run(["tmux", *sock, "kill-server"], capture_output=True)


def lane_frame(lane: dict[str, Any]) -> dict[str, Any]:
    """A frame of a device with a background lane: two granted requests, one on each host."""
    dev = {"name": "ref", "available": True, "channels": 2,
           "hosts": {"pid": 12, "background": lane}}
    busy = {"busy": 1, "channels": 2}
    return {"dump": {"devices": [dev], "budget": {"used": 2, "total": 4},
                     "requests": [
                         {"uid": 1000, "request_id": 1, "size": "LESS_THAN_1GB",
                          "priority": "NORMAL", "state": "loaded", "lane": ""},
                         {"uid": 1001, "request_id": 2, "size": "LESS_THAN_1GB",
                          "priority": "NORMAL", "state": "loaded", "lane": "background"},
                         {"uid": 1002, "request_id": 3, "size": "LESS_THAN_1GB",
                          "priority": "BACKGROUND", "state": "waiting"}],
                     "uids": {"1000": {"importance": 100}, "1001": {"importance": 400}}},
            "stats": {"ref": {**busy, "uids": {"1000": {"per_s": 3.0, "executions": 9}}}},
            "lane_stats": {"ref": {"busy": 0, "channels": 1, "uids": {
                "1001": {"per_s": 2.0, "executions": 4}}}} if lane.get("up") else {},
            "temps": {}, "at": 0.0}


def test_a_device_with_a_background_lane_shows_its_host_and_each_grants_host() -> None:
    from rich.console import Console

    def text(frame: dict[str, Any]) -> str:
        console = Console(width=160, no_color=True, highlight=False, emoji=False,
                          record=True, file=io.StringIO())
        console.print(render(frame))
        return console.export_text()

    out = text(lane_frame({"pid": 34, "up": True}))
    assert re.search(r"ref\s+\S+ 2/4\s+\S+ 1/2 busy\s+\?\s+pid 12\s*$", out, re.M), out
    assert re.search(r"└ bg lane\s+\S+ 0/1 busy\s+pid 34\b", out), out
    # Which host each grant is valid on; a waiting request has none yet.
    assert re.search(r"\b1000\s+1\s+<1GB\s+normal\s+loaded\b.*\bmain\b", out), out
    assert re.search(r"\b1001\s+2\s+<1GB\s+normal\s+loaded\b.*\bbg lane\b", out), out
    assert re.search(r"\b1002\s+3\s+<1GB\s+background\s+waiting\b.*\s-\s*$", out, re.M), out
    # Per uid and host: the lane's executions are its own rows.
    assert re.search(r"\b1000\s+foreground \(100\)\s+ref\s+3\.0\b", out), out
    assert re.search(r"\b1001\s+cached \(400\)\s+ref bg lane\s+2\.0\b", out), out
    down = text(lane_frame({"pid": 0, "up": False, "down_reason": "exited with code -9"}))
    assert re.search(r"└ bg lane\s+DOWN\s+DOWN: exited with code -9", down), down
    # No lane: no lane row and no host column in the requests.
    plain = lane_frame({"pid": 34, "up": True})
    del plain["dump"]["devices"][0]["hosts"]["background"]
    plain["lane_stats"] = {}
    alone = text(plain)
    assert "bg lane" not in alone and "main" not in alone, alone
    assert re.search(r"ref\s+\S+ 2/4\s+\S+ 1/2 busy\s+\?\s+pid 12\s*$", alone, re.M), alone


def test_a_terminal_too_small_for_the_view_is_said() -> None:
    """In a 40x12 terminal the live view cropped its columns ('de…', 're…', a column
    dropped) and cut the requests and per-uid tables without a word."""
    from rich.console import Console

    from npumanager.cli.top import fitted

    def shown(width: int, height: int) -> str:
        console = Console(width=width, height=height, no_color=True, highlight=False,
                          emoji=False, record=True, file=io.StringIO())
        console.print(fitted(console, render(lane_frame({"pid": 34, "up": True}))))
        return console.export_text()

    small = " ".join(shown(40, 12).split())
    assert re.match(r"terminal 40x12: this view needs \d+x\d+, columns or rows are cut; "
                    r"widen it, or `npu top --once \| less -S`", small), small
    assert not shown(160, 60).startswith("terminal")  # it fits: nothing said


@pytest.mark.slow
def test_once_shows_the_lane_host_and_where_each_model_runs(
        runtime_dir: Path, state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A real npud with a background lane: the lane's pid and channels, each request's host
    and the per-uid rows of each host, as `npu top --once` prints them."""
    from npumanager.constants import ModelPriority
    from tests.nn.test_background_lane import lane_config

    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    x = np.ones((1, 4), np.float32)
    with DaemonProcess(runtime_dir, lane_config(), drivers=True, env=env,
                       ready_timeout=60), NpuManager(runtime_dir) as mgr, \
            nn.device("reference", runtime_dir) as dev:
        hosts = mgr.dump()["devices"][0]["hosts"]
        models = []
        for rid, priority in ((1, ModelPriority.NORMAL), (2, ModelPriority.BACKGROUND)):
            cb = Granted()
            mgr.request_can_load_model(ModelLoadRequest(rid, priority=priority), cb)
            assert cb.event.wait(30)
            models.append(dev.prepare_model(add_model(), grant=cb.listener))
            cb.listener.notify_model_loaded(ModelLoadRequest(rid, priority=priority))
        for _ in range(20):
            for m in models:
                m.execute({"x": x})
        rc, out, err = npu(capsys, "top", "--once", "--runtime-dir", str(runtime_dir))
        for m in models:
            m.release()
    assert rc == 0, err
    uid = os.getuid()
    assert re.search(rf"^\s*reference\s.*\bpid {hosts['pid']}\s*$", out, re.M), out
    assert re.search(rf"└ bg lane\s+\S+ \d/1 busy\s+pid {hosts['background']['pid']}\b",
                     out), out
    assert re.search(rf"\b{uid}\s+1\s+<1GB\s+normal\s+loaded\b.*\bmain\s*$", out, re.M), out
    assert re.search(rf"\b{uid}\s+2\s+<1GB\s+background\s+loaded\b.*\bbg lane\s*$", out,
                     re.M), out
    for device in ("reference", "reference bg lane"):
        m = re.search(rf"\b{uid}\s+foreground \(100\)\s+{device}\s+[\d.]+\s+[\d.]+ ms\s+"
                      rf"[\d.]+ ms\s+(\d+)", out)
        assert m and int(m.group(1)) == 20, (device, out)


@pytest.mark.slow
def test_the_live_view_waits_through_an_npud_restart(runtime_dir: Path) -> None:
    """The live view ended with "ServiceUnavailable: not connected to the manager service"
    when npud stopped; the README has `systemctl restart npud` a non-event for apps. Now it
    says npud is not answering, above the last frame, and goes on once npud is back."""
    from rich.console import Console

    from npumanager.cli.top import Sampler

    def text(view: Any) -> str:
        out = io.StringIO()
        Console(file=out, width=120, no_color=True).print(view)
        return out.getvalue()

    with DaemonProcess(runtime_dir):
        sampler = Sampler(str(runtime_dir))
        before = text(sampler.view())
        assert before.startswith("npu top"), before
    try:
        away = text(sampler.view())
        assert re.match(r"\d\d:\d\d:\d\d npud is not answering: ", away), away
        assert "Ctrl-C quits" in away, away
        assert "npu top" in away  # the last frame, below
        with DaemonProcess(runtime_dir):
            back = text(sampler.view())
        assert back.startswith("npu top") and "not answering" not in back, back
    finally:
        sampler.close()
