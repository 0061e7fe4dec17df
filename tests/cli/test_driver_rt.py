"""A driver host started by hand (`npu driver NAME --config FILE`, as root) that a real npud
(root) adopts gets its burst thread at SCHED_FIFO while it serves a FOREGROUND app's frames,
as npud's own hosts do: npud ties it to its socket's listener (service/hand_ties.py) and
grants through the same checks (service/host_rt.py). Read from /proc, as root. The attacks
on that tie (another uid at the socket, a pid that exited, an unbounded host) are
tests/security/test_host_rt_hand.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from npumanager import NpuManager
from npumanager.hal import rt_sched as rt
from npumanager.testing.daemon import DaemonProcess, stop_driver_hosts
from npumanager.testing.onnx_models import add_model
from tests.cli.conftest import npu_process
from tests.cli.test_driver_protection import by_hand
from tests.hal.test_rt_sched import needs_fifo
from tests.security.harness import needs_root
from tests.security.test_host_rt import fifo_threads, host_stats, stream

pytestmark = [needs_root, needs_fifo, pytest.mark.fifo, pytest.mark.slow]

#: Every priority FOREGROUND (the test's uid has no scheduling config); the host's burst
#: thread asks for FIFO 1 while it serves one. The host and npud read the same file.
CONFIG = {"manager": {"log_level": "info"},
          "driver": [{"name": "reference", "plugin": "reference", "background_sched": "normal",
                      "foreground_priority": 1000, "foreground_rt_priority": 1}]}
TEXT = ('[manager]\nlog_level = "info"\n\n[[driver]]\nname = "reference"\n'
        'plugin = "reference"\nbackground_sched = "normal"\nforeground_priority = 1000\n'
        'foreground_rt_priority = 1\n')


def test_a_host_started_by_hand_gets_its_burst_thread_at_fifo(
        runtime_dir: Path, state_dir: Path) -> None:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    npud: DaemonProcess | None = None
    try:
        with by_hand(runtime_dir, state_dir, "--protect-foreground", "on", text=TEXT) as host:
            npud = DaemonProcess(runtime_dir, CONFIG, drivers=True, env=env,
                                 protect_foreground="on").start()
            assert npud.wait_for_output(f"driver reference adopted (pid {host.pid}", 30)
            assert (f"driver reference adopted (pid {host.pid}, started by hand: tied to "
                    "its socket's listener by SO_PEERPIDFD)") in npud.output, npud.output
            # `npu driver` bounded its own RLIMIT_RTTIME, by hand too (the soft limit is
            # the host's backstop, set once its entry wants FIFO threads).
            assert rt.rttime_limits(host.pid) == (rt.RTTIME_SOFT_US, rt.RTTIME_HARD_US)
            x = np.arange(4, dtype=np.float32).reshape(1, 4)
            seen, after = stream(runtime_dir, add_model(), x, lambda: fifo_threads(host.pid))
            # One thread, the burst's, of the hand-started host (root), at FIFO 1.
            assert seen[-1] and len(seen[-1]) == 1, seen
            (tid, (s, owner, _comm)), = seen[-1].items()
            assert s == rt.ThreadSched(os.SCHED_FIFO, 1, True)
            assert owner == rt.ThreadOwner(host.pid, 0) and tid != host.pid
            assert after == {}
            st = host_stats(runtime_dir)["rt"]
            assert st["granted"] >= 1 and st["refused"] == 0, st
            # `npu status` names no refusal for it.
            status = npu_process("status", "--runtime-dir", str(runtime_dir))
            assert f"pid {host.pid}" in status.stdout, status.stdout
            assert "no FIFO" not in status.stdout, status.stdout
            with NpuManager(str(runtime_dir)) as admin:
                [device] = admin.dump()["devices"]
            assert "no_rt" not in device["hosts"], device
    finally:
        if npud is not None:
            npud.stop()
        stop_driver_hosts(runtime_dir)
