"""`npu driver NAME --config FILE` started by hand, with real host processes and a real
npud: the host runs the entry npud would run for the same file (foreground protection
applied as npud applies it: service/protection.resolve_hand_started), says so in one line,
and "auto" follows the npud serving its runtime dir. npud, adopting a host it did not start,
names each key that runs otherwise and the fix (service/host_entries.py), in its log and in
`npu status`; a second host started by hand on a served socket path is refused."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from npumanager import NpuManager
from npumanager.config import Config
from npumanager.hal.wire import SERVICE
from npumanager.proto.v1 import driver_pb2 as pb
from npumanager.service import host_entries
from npumanager.service.protection import resolve
from npumanager.testing.daemon import DaemonProcess, stop_driver_hosts
from npumanager.testing.driver_host import DriverProcess, driver_command
from npumanager.wire.client import connect_async
from tests.cli.conftest import npu_process

pytestmark = pytest.mark.slow

#: Background work at normal priority, named in the file: the host and npud read the same.
CONFIG = {"manager": {"log_level": "info"},
          "driver": [{"name": "reference", "plugin": "reference", "background_sched": "normal"}]}
TEXT = ('[manager]\nlog_level = "info"\n\n[[driver]]\nname = "reference"\n'
        'plugin = "reference"\nbackground_sched = "normal"\n')
PROTECTION_KEYS = ["switch_interval_us", "foreground_rt_priority", "background_host"]


@contextmanager
def by_hand(runtime_dir: Path, state_dir: Path, *args: str, text: str = TEXT
            ) -> Iterator[DriverProcess]:
    """`npu driver reference --config FILE ARGS` (FILE holding ``text``; no
    --protect-foreground: the product's "auto", unless ARGS name one), ready; its output up
    to its ready line (its log lines included) in ``ready_line``."""
    cfg = runtime_dir / "npud.toml"
    cfg.write_text(text)
    (runtime_dir / "drivers").mkdir(exist_ok=True)
    cmd = driver_command("reference", runtime_dir, state_dir, cfg,
                         args if any(a.startswith("--protect") for a in args)
                         else ["--protect-foreground", "auto", *args])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    host = DriverProcess(proc, "reference", runtime_dir / "drivers" / "reference.sock")
    try:
        host.wait_ready(60)
        yield host
    finally:
        host.stop()


def reported_entry(sock: Path) -> str:
    """What the host says it runs, as npud hears it (hal.attach_manager's reply; the test
    runs as root: an admin)."""
    async def attach() -> str:
        conn, _ = await connect_async(str(sock), SERVICE, {}, client_name="npud")
        try:
            payload, _ = await conn.call("hal.attach_manager", pb.AttachManager())
            return pb.HeldGrants.FromString(payload).host_entry_json
        finally:
            conn.close()
    return asyncio.run(attach())


def npud_runs(mode: str) -> Config:
    """The config npud runs with ``--protect-foreground mode`` for the same file."""
    cfg, _ = resolve(Config.load(None, CONFIG), mode, True)
    return cfg


@pytest.mark.parametrize("mode", ["on", "off"])
def test_a_host_started_by_hand_runs_the_entry_npud_would(
        runtime_dir: Path, state_dir: Path, mode: str) -> None:
    with by_hand(runtime_dir, state_dir, "--protect-foreground", mode) as host:
        assert f'foreground protection: {mode} (protect_foreground = "{mode}")' \
            in host.ready_line, host.ready_line
        reported = reported_entry(host.socket_path)
    assert host_entries.differences(npud_runs(mode), "reference", "", reported) == []
    other = "off" if mode == "on" else "on"
    assert [d.split(" = ")[0] for d in host_entries.differences(
        npud_runs(other), "reference", "", reported)] == PROTECTION_KEYS


@pytest.mark.parametrize("mode", ["on", "off"])
def test_auto_follows_the_npud_serving_the_runtime_dir(
        runtime_dir: Path, state_dir: Path, mode: str) -> None:
    # (A pure manager is enough to be asked; its protection is the flag's.)
    with DaemonProcess(runtime_dir, protect_foreground=mode) as npud, \
            by_hand(runtime_dir, state_dir) as host:
        assert (f"foreground protection: {mode} (auto: as the npud on "
                f"{runtime_dir}/npu.sock (pid {npud.pid}) runs)") in host.ready_line, \
            host.ready_line
        reported = reported_entry(host.socket_path)
    assert host_entries.differences(npud_runs(mode), "reference", "", reported) == []


def test_npud_names_what_a_host_it_did_not_start_runs_otherwise(
        runtime_dir: Path, state_dir: Path) -> None:
    env = dict(os.environ, NPU_STATE_DIR=str(state_dir))
    rt = str(runtime_dir)
    npuds: list[DaemonProcess] = []
    try:
        with by_hand(runtime_dir, state_dir, "--protect-foreground", "on") as host:
            npud = DaemonProcess(runtime_dir, CONFIG, drivers=True, env=env,
                                 protect_foreground="off").start()
            npuds.append(npud)
            assert npud.wait_for_output("runs another entry", 30), npud.output
            [line] = [ln for ln in npud.lines if "runs another entry" in ln]
            assert (f"driver reference: its host (pid {host.pid}, not started by this "
                    "npud) runs another entry than npud would run it with: "
                    "switch_interval_us = 500 (npud's: 0), foreground_rt_priority = 1 "
                    "(npud's: 0), background_host = true (npud's: false). npud serves it "
                    "as it runs. These are keys foreground protection sets (off "
                    '(protect_foreground = "off") in npud): to match, restart the host '
                    "with `npu driver reference --config FILE --protect-foreground off`, "
                    "or stop it: npud then starts its own.") in line, line
            with NpuManager(rt) as admin:
                [device] = admin.dump()["devices"]
            assert device["hosts"] == {"pid": host.pid, "entry_differs": PROTECTION_KEYS}
            status = npu_process("status", "--runtime-dir", rt)
            # (The hosts column is the table's last: its wrapped lines join up.)
            assert (f"pid {host.pid} (other entry: switch_interval_us, "
                    "foreground_rt_priority, background_host)") \
                in " ".join(status.stdout.split()), status.stdout
            # A second host by hand would take the served path: refused, named.
            second = npu_process("driver", "reference", "--runtime-dir", rt,
                                 "--state-dir", str(state_dir), "--protect-foreground",
                                 "off", env={"NPU_STATE_DIR": str(state_dir)})
            assert second.returncode == 1
            assert (f"driver reference: a driver host already serves {rt}/drivers/"
                    "reference.sock: stop it first") in second.stderr, second.stderr
            npud.stop(keep_drivers=True)  # (a restart: the hand-started host stays)
            # An npud that runs what the host runs adopts it and says nothing of it.
            npud = DaemonProcess(runtime_dir, CONFIG, drivers=True, env=env,
                                 protect_foreground="on").start()
            npuds.append(npud)
            assert f"driver reference adopted (pid {host.pid}" in npud.output
            assert "runs another entry" not in npud.output, npud.output
            with NpuManager(rt) as admin:
                [device] = admin.dump()["devices"]
            assert device["hosts"]["pid"] == host.pid
            assert "entry_differs" not in device["hosts"]
            # (The lane is npud's to start: `npu driver` serves a device's main host.)
            assert device["hosts"]["background"]["up"] is True
            npud.stop(keep_drivers=True)
            assert json.loads(reported_entry(host.socket_path))["background_host"] is True
    finally:
        for npud in reversed(npuds):
            npud.stop()
        stop_driver_hosts(runtime_dir)
