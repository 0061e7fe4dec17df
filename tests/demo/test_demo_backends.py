"""`npu demo --driver`: the same demo on the openvino driver; what it refuses, and why."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.demo.runner import run_demo
from tests.drivers.backends import needs_openvino


def _npu(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "npumanager", *args], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


def test_torch_demo_is_refused_with_the_reason() -> None:
    res = _npu("demo", "--driver", "torch")
    assert res.returncode == 2
    assert "torch.export programs" in res.stderr


@needs_openvino
@pytest.mark.slow
@pytest.mark.timeout(150)  # the demo's 100 s, its stack dump and its cleanup
def test_fast_demo_on_openvino_shows_every_behaviour() -> None:
    rc, out, err = run_demo(["demo", "--fast", "--no-color", "--driver", "openvino", "--out",
                             ""], 100)
    assert rc == 0, out + err
    assert "npud + the openvino driver" in out
    assert "device openvino" in out and "cache files 1+0" in out
    # The LLM's model came back from the verified cache (OpenVINO's exported blob).
    row = re.search(r"llm-decoder\s*\|\s*(\d+)\s*\|[^|]*\|\s*([^|]*?)\s*\|", out)
    assert row is not None and row.group(2) not in ("", "-"), out[-2000:]
