"""examples/ against a real npud, as the README's tour runs them (test_usage.py has them
without npud): on a device that is not npud's first, so a grant asked for the wrong device
shows, and with the mistakes a newcomer makes, each one line and an exit status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from npumanager.testing.daemon import DaemonProcess

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(script: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(EXAMPLES / script), *argv],
                          capture_output=True, text=True, timeout=120)


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
        fg = example("foreground_app.py", *rt, "--seconds", "0.2")
        bg = example("background_llm.py", *rt, "--rounds", "1", "--work-seconds", "0.1")
    for proc in (first, again, llm, fg, bg):
        assert proc.returncode == 0 and not proc.stderr, (proc.args, proc.stdout, proc.stderr)
    assert first.stdout.startswith("device ref:b ") and "(compiled)" in first.stdout
    assert "(from the compilation cache)" in again.stdout
    # npud's COMPLETE follows the driver's release: the example waits for it.
    for proc in (first, again, fg):
        assert proc.stdout.endswith("request ended: COMPLETE\n"), proc.stdout
    assert (wrong.returncode, wrong.stderr) == (1, "no device 'b'; npud serves: ref:a, ref:b\n")
    assert (llm_wrong.returncode, llm_wrong.stderr) == (
        1, "no device 'b'; npud serves: ref:a, ref:b\n")
    assert unwritable.returncode == 1 and unwritable.stderr.startswith("run_model.py: Not a "
                                                                       "directory: "), \
        unwritable.stderr
    assert llm.stdout.rstrip().splitlines()[-1].startswith("decoded 64 tokens")
    assert "round 1: unloaded" in bg.stdout
