"""Issue #10's corner (b) with real processes: npud is SIGKILLed after its driver host is
ready and before it attached. The host (started as npud starts it: its child, with
``--exit-with-manager --launcher-pid``) hears no hang-up from a link that never was; it
watches its launcher's pid instead. A stand-in npud (npumanager.testing.driver_host
.launched_host) that never attaches makes the window as wide as the test wants, so the
corner is reached every run, not by a race."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from npumanager.testing.daemon import DaemonProcess, driver_hosts
from npumanager.testing.driver_host import launched_host, wait_exit

pytestmark = pytest.mark.slow


def _config(tmp_path: Path, grace: float) -> Path:
    cfg = tmp_path / "npud.toml"
    cfg.write_text(f"[manager]\norphan_grace_s = {grace}\n")
    return cfg


def test_a_host_whose_npud_died_before_it_attached_exits_after_its_grace(
        tmp_path: Path, runtime_dir: Path, state_dir: Path) -> None:
    with launched_host("reference", runtime_dir, state_dir, _config(tmp_path, 1.0)) \
            as (launcher, host):
        # Its npud lives (only slow to attach, as on a loaded machine): the host waits,
        # however long that takes; three graces here.
        assert not wait_exit(host, 3.0), "the host left an npud that was still starting it"
        launcher.kill()
        # Its grace (1 s) then ends; 60 s is how long a loaded machine may take.
        assert wait_exit(host, 60.0), "the orphaned host lingers past its grace"
        assert driver_hosts(runtime_dir) == []


def test_the_next_npud_adopts_a_host_its_predecessor_never_attached(
        tmp_path: Path, runtime_dir: Path, state_dir: Path) -> None:
    """Within the grace, the next npud attaches to the host that is there rather than
    starting a second one on its socket path."""
    cfg = _config(tmp_path, 60.0)
    with launched_host("reference", runtime_dir, state_dir, cfg) as (launcher, host):
        launcher.kill()
        launcher.wait()
        env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
        npud = DaemonProcess(runtime_dir, {"manager": {"orphan_grace_s": 60.0}},
                             drivers=True, env=env, ready_timeout=60).start()
        try:
            assert f"driver reference adopted (pid {host}," in npud.output, npud.output
            assert driver_hosts(runtime_dir) == [host]
        finally:
            npud.stop()
