"""A stuck demo can be asked where it is (SIGUSR1), and its waits end by themselves.

``kill -USR1`` writes a process's stacks and lets it go on: npud and the driver host
(through `npu`'s entry point), a demo app (into its log), the demo itself (its own
stacks, then every process it started, then their logs). The scenes' waits are cut at
the demo's time-up, so a run where events go missing reports them and ends.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from npumanager.demo import diag
from npumanager.demo.cast import DemoOptions
from npumanager.demo.observe import EventLog
from npumanager.demo.process import AppProcess, LineQueue, Outbox
from npumanager.demo.render import Renderer
from npumanager.demo.scenario import Scenario
from npumanager.testing.daemon import DaemonProcess


def _waiting_app(out: Outbox, commands: LineQueue) -> None:
    stop = threading.Event()
    commands.start(lambda item: stop.set() if item.get("cmd") == "stop" else None)
    out.emit("up")
    stop.wait(20)
    out.emit("bye")


def test_sigusr1_writes_an_apps_stacks_to_its_log_and_it_goes_on(tmp_path: Path) -> None:
    log = EventLog()
    log_path = tmp_path / "app.log"
    # The demo's handler is what a forked app inherits; the app must not run it.
    undo = diag.install(lambda: [])
    try:
        proc = AppProcess("app", None, _waiting_app, log.add, str(log_path))
    finally:
        undo()
    try:
        assert log.wait("app", "up", 30.0) is not None
        os.kill(proc.pid, signal.SIGUSR1)
        # faulthandler writes the stacks a thread at a time: read until the app's own
        # frame is there (a read between two writes saw only the first thread's, once,
        # on a loaded machine).
        deadline = time.monotonic() + 30
        while "_waiting_app" not in log_path.read_text():
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
        assert "most recent call first" in log_path.read_text()
        assert not proc.poll()  # still running
        proc.stop(timeout=10.0)
        assert log.wait("app", "bye", 1.0) is not None
    finally:
        proc.kill()


def test_sigusr1_writes_npuds_stacks_and_npud_keeps_serving(runtime_dir: Path) -> None:
    from npumanager import NpuManager

    with DaemonProcess(runtime_dir, ready_timeout=60) as npud:
        npud.signal(signal.SIGUSR1)
        assert npud.wait_for_output("most recent call first", 30), npud.output
        assert npud.proc is not None and npud.proc.poll() is None
        with NpuManager(runtime_dir) as mgr:
            assert "params" in mgr.dump()


def test_the_demo_reports_its_processes_stacks_and_logs_on_sigusr1() -> None:
    """The report (written on a thread, while the demo goes on): the demo's own stacks, the
    npumanager processes it started, signalled in order (their stacks go to their stderr,
    here the demo's), then the logs it was given."""
    script = """
import subprocess, sys, time
from npumanager.demo import diag
from npumanager.cli.main import _stacks_on_sigusr1
_stacks_on_sigusr1()  # what `npu` does first
child = subprocess.Popen([sys.executable, "-c", "import faulthandler, signal, time; "
    "faulthandler.register(signal.SIGUSR1, all_threads=True); import npumanager; "
    "print(flush=True); time.sleep(30)"], stdout=subprocess.PIPE)
child.stdout.readline()  # its handler is in place
diag.install(lambda: [("a log", "what the app wrote")])
print(child.pid, flush=True)
time.sleep(30)
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        child = int(proc.stdout.readline())
        proc.send_signal(signal.SIGUSR1)
        time.sleep(diag.SETTLE_S * 2 + 2.0)
        assert proc.poll() is None  # it goes on
        assert diag.descendants(proc.pid) == [child]  # which went on too
    finally:
        for pid in diag.descendants(proc.pid):
            os.kill(pid, signal.SIGKILL)
        proc.kill()
        _, err = proc.communicate()
    assert "stacks of its processes, in this order ===\n" f"{child}: " in err, err
    assert err.count("most recent call first") >= 2, err  # the demo's and its child's
    assert "=== a log ===\nwhat the app wrote" in err
    assert err.rstrip().endswith("=== end of the demo's report ===")


def test_descendants_are_found_through_proc() -> None:
    child = subprocess.Popen([sys.executable, "-c",
                              "import subprocess, sys, time; "
                              "p = subprocess.Popen([sys.executable, '-c', "
                              "'import time; time.sleep(30)']); print(p.pid, flush=True); "
                              "time.sleep(30)"], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    try:
        grandchild = int(child.stdout.readline())
        found = diag.descendants(os.getpid())
        assert child.pid in found and grandchild in found
        assert diag.descendants(grandchild) == []
    finally:
        for pid in diag.descendants(child.pid):
            os.kill(pid, signal.SIGKILL)
        child.kill()
        child.wait()
        child.stdout.close()


def test_a_missing_event_after_the_time_up_is_reported_at_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    buf = io.StringIO()
    scene = Scenario(DemoOptions(fast=True), Renderer(color=False, stream=buf))
    scene.log.add({"app": "llm", "t": time.monotonic(), "ev": "decode", "steps": 16, "ms": 1})
    scene.time_up = time.monotonic() - 1.0
    waited: list[float] = []
    wait = scene.log.wait

    def recorded(app: Any, ev: str, timeout: float, *args: Any) -> Any:
        waited.append(timeout)
        return wait(app, ev, timeout, *args)

    monkeypatch.setattr(scene.log, "wait", recorded)
    # An event that came is found however late; one that did not is reported, unwaited.
    assert scene.expect("llm", "decode", "llm decoding", 30) is not None
    assert scene.expect("camera", "frame", "camera streaming", 30) is None
    assert waited == [0.0, 0.0]  # not 4 x 30 s each
    assert scene.run_rec.failures == ["camera streaming"]
    assert ("expected within 0 s (the demo's time is up), did not happen: camera streaming"
            in buf.getvalue())
