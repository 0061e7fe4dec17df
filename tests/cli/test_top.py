"""`npu top`: one frame with --once, and the live view in a real terminal (tmux)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from npumanager import ModelLoadRequest, NpuManager, nn
from npumanager.cli.top import bar, sparkline
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
