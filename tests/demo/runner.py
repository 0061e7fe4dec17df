"""Running `npu demo` from a test: its whole output, and its stacks when it is stuck."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from npumanager.demo import diag
from npumanager.demo.diag import descendants


def run_demo(args: list[str], timeout: float, **popen: Any) -> tuple[int, str, str]:
    """Run `npu ARGS`; (exit status, stdout, stderr). A demo still running after
    ``timeout`` s fails the test with its whole output and every process's stacks: it is
    sent SIGUSR1 (npu demo then writes its threads' stacks, signals npud, the driver
    host, its compile worker and the apps, and writes npud's output and the apps' logs,
    where their stacks land), then SIGTERM (its own cleanup), then SIGKILL."""
    proc = subprocess.Popen([sys.executable, "-m", "npumanager", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        pass
    sent = ["SIGUSR1 (stacks)"]
    tree = descendants(proc.pid)
    proc.send_signal(signal.SIGUSR1)
    for sig, wait in ((None, diag.SETTLE_S + 3.0), (signal.SIGTERM, 10.0),
                      (signal.SIGKILL, None)):
        if sig is not None:
            sent.append(sig.name)
            proc.send_signal(sig)
        try:
            out, err = proc.communicate(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    if "SIGKILL" in sent:  # npud and its host, which a SIGKILLed demo could not stop
        for pid in tree:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    pytest.fail(f"npu {' '.join(args)} did not end within {timeout:g} s; sent "
                f"{', '.join(sent)}: exit status {proc.returncode}. Its whole output, with "
                f"the stacks of every process:\n--- stdout ---\n{out}\n--- stderr ---\n{err}",
                pytrace=False)
