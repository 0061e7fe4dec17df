"""Which keys of a driver host's entry differ from the one npud would run it with, and what
npud says of it.

npud passes each host it starts the entry it resolved (``--host-config-json``); a host it
did not start (one started by hand, `npu driver NAME --config FILE`, or one an earlier npud
with another config or protection left running) runs its own. npud still adopts such a host
(service/supervisor.py: its loaded models keep serving, and a second host on its socket
path would leave the first serving apps npud cannot see), so a host running another entry
is not refused: npud names each key that differs and the fix, in its log (a warning at each
attach) and in `npu status` (the device's hosts column). The host says what it runs in
hal.attach_manager's reply (hal/host_config.entry_summary); a host without it (an older
version) is not compared.
"""

from __future__ import annotations

import json
from typing import Any

from npumanager.config import Config
from npumanager.hal.host_config import HostConfig, entry_differences, entry_summary
from npumanager.service.protection import ENTRY_KEYS, LANE_KEYS, PREFIX, state_of


def differences(cfg: Config, name: str, lane: str, reported: str) -> list[str]:
    """The keys in which the entry a host ``reported`` (its JSON summary) differs from the
    one npud runs device ``name``'s host (``lane``: its background lane's) with, one
    ``KEY = HOST'S (npud's: NPUD'S)`` each; none where it did not say."""
    if not reported:
        return []
    try:  # (the host runs code an app chose: its reply is read as untrusted)
        running = json.loads(reported)
    except (ValueError, RecursionError):
        return ["its entry (unreadable)"]
    if not isinstance(running, dict):
        return ["its entry (unreadable)"]
    return entry_differences(entry_summary(HostConfig.from_config(cfg, name, lane)), running)


def fix(diffs: list[str], host: str, lane: str, protection: str) -> str:
    """What to do about a host running another entry: restart it as npud would run it (with
    the protection flag where only keys foreground protection sets differ), or stop it.
    ``protection``: npud's start line for it (service/protection.Protection.line)."""
    stop = "stop it: npud then starts its own"
    if lane:  # (a background lane is npud's to start: `npu driver` runs a main host)
        return f"To match, {stop}."
    keys = {d.split(" = ", 1)[0] for d in diffs}
    if keys <= {*ENTRY_KEYS, *LANE_KEYS}:
        on = state_of(protection)
        flag = "on" if on else "off"
        said = protection.removeprefix(PREFIX) if on is not None else "?"
        return (f"These are keys foreground protection sets ({said} in npud): to match, "
                f"restart the host with `npu driver {host} --config FILE "
                f"--protect-foreground {flag if on is not None else 'on|off'}`, or {stop}.")
    return ("To match, restart the host with npud's config file and no overrides "
            f"(--channels, --background-sched), or {stop}.")


def warning(label: str, pid: int, diffs: list[str], why: str) -> str:
    """npud's log line for it."""
    return (f"driver {label}: its host (pid {pid}, not started by this npud) runs another "
            f"entry than npud would run it with: {', '.join(diffs)}. npud serves it as it "
            f"runs. {why}")


def summary(diffs: list[str]) -> dict[str, Any]:
    """For `npu status` (service/host_lanes.host_pids)."""
    return {"entry_differs": [d.split(" = ", 1)[0] for d in diffs]} if diffs else {}


__all__ = ["differences", "fix", "summary", "warning"]
