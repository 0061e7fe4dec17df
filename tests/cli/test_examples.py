"""examples/ against a real npud, as the README's tour runs them (test_usage.py has them
without npud): on a device that is not npud's first, so a grant asked for the wrong device
shows, and with the mistakes a newcomer makes, each one line and an exit status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from npumanager import Importance, NpuManager
from npumanager.service.rt_privilege import CAP_SYS_NICE, has_cap
from npumanager.testing.daemon import DaemonProcess
from tests.security.harness import ATTACKER, BYSTANDER

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(script: str, *argv: str, uid: int | None = None
            ) -> subprocess.CompletedProcess[str]:
    """``script`` run with ``argv`` (as ``uid``, where given: the test runs as root)."""
    user = {} if uid is None else {"user": uid, "group": uid, "cwd": "/"}
    return subprocess.run([sys.executable, str(EXAMPLES / script), *argv],  # type: ignore[call-overload, no-any-return]
                          capture_output=True, text=True, timeout=120, **user)


def test_mistakes_before_npud_is_asked(tmp_path: Path) -> None:
    missing = tmp_path / "nosuch.onnx"
    proc = example("run_model.py", "--model", str(missing))
    assert (proc.returncode, proc.stderr) == (
        1, f"run_model.py: No such file or directory: {missing}\n")
    proc = example("run_model.py", "--repeat", "0")
    assert proc.returncode == 2 and "--repeat: '0' is not a whole number >= 1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_every_example_on_the_second_device(runtime_dir: Path, state_dir: Path,
                                            tmp_path: Path) -> None:
    cfg = {"driver": [{"name": "ref", "plugin": "reference", "channels": 1,
                       "options": {"devices": ["a", "b"]}}]}
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    rt = ["--runtime-dir", str(runtime_dir)]
    cache = ["--cache-dir", str(tmp_path / "cache")]
    with DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60):
        first = example("run_model.py", *rt, *cache, "--device", "ref:b")
        again = example("run_model.py", *rt, *cache, "--device", "ref:b")
        wrong = example("run_model.py", *rt, "--device", "b")
        unwritable = example("run_model.py", *rt, "--cache-dir", str(runtime_dir / "npu.sock"
                                                                    / "cache"))
        llm = example("llm_decode_loop.py", *rt, "--device", "ref:b", "--tokens", "64")
        llm_wrong = example("llm_decode_loop.py", *rt, "--device", "b")
        fg = example("foreground_app.py", *rt, "--device", "ref:b", "--seconds", "0.2")
        fg_wrong = example("foreground_app.py", *rt, "--device", "b")
        bg = example("background_llm.py", *rt, "--rounds", "1", "--work-seconds", "0.1")
    for proc in (first, again, llm, bg):
        assert proc.returncode == 0 and not proc.stderr, (proc.args, proc.stdout, proc.stderr)
    # The foreground stream asked for its real-time thread; this npud (protection off, no
    # app_rt_priority) has none to give: the example says why and streams on.
    assert fg.returncode == 0 and "Traceback" not in fg.stderr, (fg.stdout, fg.stderr)
    assert ("real-time thread: refused, the stream goes on at normal priority "
            "(RealtimeUnavailable: real-time threads are off in npud's config ([manager] "
            "app_rt_priority = 0))\n") in fg.stdout, fg.stdout
    assert " executions at 30/s on ref:b: p50 " in fg.stdout, fg.stdout
    assert first.stdout.startswith("device ref:b ") and "(compiled)" in first.stdout
    assert "(from the compilation cache)" in again.stdout
    # npud's COMPLETE follows the driver's release: the example waits for it.
    for proc in (first, again, fg):
        assert proc.stdout.endswith("request ended: COMPLETE\n"), proc.stdout
    assert (wrong.returncode, wrong.stderr) == (1, "no device 'b'; npud serves: ref:a, ref:b\n")
    for proc in (llm_wrong, fg_wrong):
        assert (proc.returncode, proc.stderr) == (1, "no device 'b'; npud serves: ref:a, "
                                                  "ref:b\n"), proc.args
    assert unwritable.returncode == 1 and unwritable.stderr.startswith("run_model.py: Not a "
                                                                       "directory: "), \
        unwritable.stderr
    assert llm.stdout.rstrip().splitlines()[-1].startswith("decoded 64 tokens")
    assert "round 1: unloaded" in bg.stdout


@pytest.mark.fifo
@pytest.mark.skipif(os.geteuid() != 0 or not has_cap(CAP_SYS_NICE),
                    reason="needs root with CAP_SYS_NICE (npud's protection on, apps as uids)")
def test_the_foreground_stream_gets_its_thread_as_a_visible_app(
        runtime_dir: Path, state_dir: Path) -> None:
    """examples/foreground_app.py as a voice assistant runs it: under npud's default
    protection ("auto": on as root) a VISIBLE uid's burst thread is granted SCHED_FIFO 2;
    a SERVICE uid's ask is refused, the example says why, and both stream to the end."""
    cfg = {"driver": [{"name": "reference", "plugin": "reference",
                       "background_sched": "normal"}]}
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    rt = ["--runtime-dir", str(runtime_dir), "--seconds", "0.3"]
    with DaemonProcess(runtime_dir, cfg, drivers=True, env=env, ready_timeout=60,
                       protect_foreground=None):
        with NpuManager(runtime_dir) as admin:
            admin.set_uid_importance(ATTACKER, Importance.VISIBLE)
            admin.set_uid_importance(BYSTANDER, Importance.SERVICE)
        voice = example("foreground_app.py", *rt, uid=ATTACKER)
        service = example("foreground_app.py", *rt, uid=BYSTANDER)
    for proc in (voice, service):
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, (proc.stdout,
                                                                         proc.stderr)
        assert " executions at 30/s on reference: p50 " in proc.stdout, proc.stdout
        assert proc.stdout.endswith("request ended: COMPLETE\n"), proc.stdout
    assert "real-time thread: granted by npud (SCHED_FIFO 2)\n" in voice.stdout, voice.stdout
    assert (f"real-time thread: refused, the stream goes on at normal priority "
            f"(PermissionDenied: uid {BYSTANDER}'s importance is 300; real-time threads are "
            "for VISIBLE (200) or more important apps ([manager] app_rt_importance))\n"
            ) in service.stdout, service.stdout
